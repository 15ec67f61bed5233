"""PDF: the text of every page (pypdfium2, PDFium's own text layer), each page a unit under the headings its
outline (bookmarks) puts it in. A page with no text (a scan) is counted, or, with `ocr`, rendered and read by
Tesseract (Debian's tesseract-ocr, through pytesseract)."""

from __future__ import annotations

from gradfuse.candidate import Location
from gradfuse.ingest.readers import Parsed, Reading, Unreadable


def read_pdf(data: bytes, name: str, reading: Reading) -> Parsed:
    import pypdfium2 as pdfium

    try:
        document = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as error:
        if "password" in str(error).lower():
            raise Unreadable("encrypted", "the PDF is encrypted (it needs a password)") from None
        raise Unreadable("corrupt", f"not a readable PDF ({error})") from None
    limits = reading.limits
    try:
        pages = len(document)
        if pages > limits.max_pages:
            raise Unreadable("too many pages", f"{pages} pages, over the limit of {limits.max_pages} "
                                               "(--max-pages)")
        headings = _headings_by_page(document, pages)
        units, empty, read_by_ocr = [], [], 0
        for index in range(pages):
            page = document[index]
            try:
                text = _clean(_page_text(page, reading))
                if not text and limits.ocr:
                    text, read_by_ocr = _ocr(page, reading), read_by_ocr + 1
            finally:
                page.close()
            if not text:
                empty.append(index + 1)
                continue
            units.append(reading.unit(text, Location(name, page=index + 1, headings=headings[index])))
        return Parsed.joined(units, pages_without_text=tuple(empty), pages_read_by_ocr=read_by_ocr)
    finally:
        document.close()


def _page_text(page, reading: Reading) -> str:
    """A page's text, at most `max_page_chars` of it (nested forms can draw one string a million times)."""
    textpage = page.get_textpage()
    try:
        limit = reading.limits.max_page_chars
        if textpage.count_chars() <= limit:
            return textpage.get_text_bounded()
        reading.note(f"pages cut to {limit} characters (--max-page-chars)")
        return textpage.get_text_range(0, limit)
    finally:
        textpage.close()


OCR_SCALE = 300 / 72  # a page rendered at 300 dpi, what Tesseract reads best


def _ocr(page, reading: Reading) -> str:
    """A page's text as Tesseract reads its rendering, at 300 dpi or less: at most `max_ocr_megapixels` (a
    14,400 pt square page needed a 3.4 GB bitmap)."""
    import pytesseract

    width, height = page.get_size()  # points
    room = reading.limits.max_ocr_megapixels * 1e6
    scale = min(OCR_SCALE, (room / max(width * height, 1.0)) ** 0.5)
    if scale < OCR_SCALE:
        reading.note("large pages rendered below 300 dpi for OCR (--max-ocr-megapixels)")
    image = page.render(scale=scale, grayscale=True).to_pil()
    return " ".join(pytesseract.image_to_string(image).split("\n\n")).strip()


def _clean(text: str) -> str:
    """PDFium's text as plain text: its line breaks are CR LF, and "\x02" marks a word hyphenated at a line's end
    (it keeps the break out: "man\x02agement" is "management")."""
    return text.replace("\r\n", "\n").replace("\x02", "").strip()


def _headings_by_page(document, pages: int) -> list[tuple[str, ...]]:
    """The outline's path in force on each page: the last bookmark at or before it, with its parents."""
    marks = []
    for bookmark in document.get_toc(max_depth=8):
        destination = bookmark.get_dest()
        index = destination.get_index() if destination is not None else None
        title = (bookmark.get_title() or "").strip()
        if index is not None and title:
            marks.append((index, bookmark.level, title))
    marks.sort(key=lambda mark: mark[0])  # the outline's order need not be the pages'
    by_page, path, position = [], [], 0
    for page in range(pages):
        while position < len(marks) and marks[position][0] <= page:
            _, level, title = marks[position]
            path = path[:level] + [title]
            position += 1
        by_page.append(tuple(path))
    return by_page
