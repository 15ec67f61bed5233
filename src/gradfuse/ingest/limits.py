"""What a file may cost before it is skipped, by default (`index files` options; a spec's options hold them):
plain values in a module that imports nothing, so that the CLI's help shows them without loading the readers
(ingest/readers' ReaderLimits checks what a user gives)."""

LIMITS = {
    "max_file_mb": 200,  # any file
    "max_pages": 2000,  # of a PDF, or slides of a deck
    "max_rows": 1_000_000,  # of one spreadsheet, all sheets together
    "max_unzipped_mb": 1000,  # an Office file's parts, uncompressed (a zip bomb says less than it holds)
    "max_zip_entries": 10_000,  # an Office file's parts (Python's zip reader keeps an object per entry)
    "deadline_s": 60.0,  # to parse one file
    "max_text_mb": 50,  # text one file may produce, all its units together (tables repeat their header)
    "max_chunks": 100_000,  # chunks one file may make (each is embedded): a 1,000,000-row sheet makes ~70,000
    "max_worker_mb": 2048,  # memory (address space) of the worker process that parses
    "max_page_chars": 200_000,  # text of one PDF page (a dense page holds about 5,000); more is cut
    "max_cell_chars": 2000,  # text of one table cell; more is cut
    "max_columns": 1000,  # cells of one table row; more are left out
    # What every chunk repeats: a table's header row (a chunk is 150 words), a section's headings, a file's title
    "max_header_chars": 500,
    "max_ocr_megapixels": 40,  # a page rendered for OCR (A4 at 300 dpi is 8.7); larger pages are scaled down
    "ocr": False,  # read PDF pages without a text layer with Tesseract (else they are counted and reported)
}
