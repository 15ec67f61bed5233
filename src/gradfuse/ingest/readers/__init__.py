"""One reader per file format behind one interface: a file in, its units out, each a piece of text with the
place it stands (`gradfuse.candidate.Location`: page, slide, sheet and rows, headings).

- plain.py: .txt; markup.py: Markdown (cut along its headings) and HTML (boilerplate removed by trafilatura,
  then cut along headings);
- pdf.py: text per page (pypdfium2), headings from the document's outline; pages without a text layer counted;
- word.py: .docx paragraphs under their heading path, tables as tables (python-docx);
- slides.py: .pptx, one unit per slide with its title and notes (python-pptx);
- sheets.py: .xlsx (openpyxl) and .csv: chunks of rows that each repeat the header row.

A file's format is read from its first bytes where they say it (a PDF's "%PDF-", a zip's Word, PowerPoint or
Excel parts), else from its extension. Every format is read in a worker process (isolation.py) with a deadline,
a memory limit and a budget of text per file; a zip's entries and uncompressed size are checked before any part
is read, tables' cells, columns and repeated headers are capped. A file that fails a limit is skipped with its
reason (what was only cut is reported as cut), and the rest of the folder is read.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, replace

from gradfuse.candidate import Location
from gradfuse.checked import FILE_SETTINGS, Count, Flag, Seconds
from gradfuse.ingest.limits import LIMITS


@dataclass(frozen=True)
class Unit:
    """A piece of a file: text that is chunked further by words (`table`: rows already cut into chunks that repeat
    their header, kept whole), where it stands, and where it starts in the file's text (None for table chunks,
    which repeat the header and so are no slice of it)."""

    text: str
    location: Location
    start: int | None = None
    table: bool = False


@dataclass(frozen=True)
class Parsed:
    units: list[Unit]
    text: str = ""  # the file's text, which the units' starts index (pages, sections, slides joined)
    pages_without_text: tuple[int, ...] = ()  # PDF pages with no text layer (scanned), left unread
    pages_read_by_ocr: int = 0
    title: str = ""  # an HTML page's title or a Markdown file's first heading ("" where the file has none)
    cut: tuple[str, ...] = ()  # what was cut to a limit ("cells cut to 2000 characters (--max-cell-chars)")
    decoded_with_fallback: bool = False  # a text file that was not UTF-8 (read as Windows-1252 or latin-1)

    @classmethod
    def joined(cls, units: list[Unit], **counts) -> Parsed:
        """`units` in file order with their texts joined by blank lines as the file's text, each text unit's
        start set in it (table chunks repeat their header, so they are no part of it)."""
        placed, texts, start = [], [], 0
        for unit in units:
            if not unit.table:
                unit = replace(unit, start=start)
                texts.append(unit.text)
                start += len(unit.text) + 2
            placed.append(unit)
        return cls(placed, "\n\n".join(texts), **counts)


@dataclass(frozen=True)
class ReaderLimits:
    """What a file may cost before it is skipped (`index files` options; a spec's options hold them)."""

    __pydantic_config__ = FILE_SETTINGS
    max_file_mb: Count = LIMITS["max_file_mb"]
    max_pages: Count = LIMITS["max_pages"]
    max_rows: Count = LIMITS["max_rows"]
    max_unzipped_mb: Count = LIMITS["max_unzipped_mb"]
    max_zip_entries: Count = LIMITS["max_zip_entries"]
    deadline_s: Seconds = LIMITS["deadline_s"]
    max_text_mb: Count = LIMITS["max_text_mb"]
    max_chunks: Count = LIMITS["max_chunks"]
    max_worker_mb: Count = LIMITS["max_worker_mb"]
    max_page_chars: Count = LIMITS["max_page_chars"]
    max_cell_chars: Count = LIMITS["max_cell_chars"]
    max_columns: Count = LIMITS["max_columns"]
    max_header_chars: Count = LIMITS["max_header_chars"]
    max_ocr_megapixels: Count = LIMITS["max_ocr_megapixels"]
    ocr: Flag = LIMITS["ocr"]


LIMIT_OPTIONS = tuple(LIMITS)  # a files source's options that are limits


class Reading:
    """One file's parse in progress: its limits, the text it may still produce (counted as units are made, so
    a small file that multiplies one string stops early), and what was cut to a limit."""

    def __init__(self, limits: ReaderLimits):
        self.limits = limits
        self._left = limits.max_text_mb * 1_000_000
        self._units = 0
        self.cut: list[str] = []

    def spend(self, text: str) -> str:
        """`text`, counted against the file's budget (Unreadable once it is spent)."""
        self._left -= len(text)
        if self._left < 0:
            raise Unreadable("too much text", f"it produces over {self.limits.max_text_mb} MB of text "
                                              "(--max-text-mb)")
        return text

    def unit(self, text: str, location: Location, start: int | None = None, table: bool = False) -> Unit:
        """A unit of `text`, counted with the place every chunk of it repeats (its heading path and sheet, cut
        to `max_header_chars` together: a 300 KB heading line made a 300 KB Markdown file a 95 MB index, a
        thousand nested Word headings a 52 KB file 252 MB), and counted against `max_chunks` (each unit is a
        chunk at least)."""
        self._units += 1
        if self._units > self.limits.max_chunks:
            raise Unreadable("too many chunks", f"it makes over {self.limits.max_chunks} chunks (--max-chunks)")
        location = self._placed(location)
        self.spend(location.sheet or "")
        for heading in location.headings:
            self.spend(heading)
        return Unit(self.spend(text), location, start, table)

    def _placed(self, location: Location) -> Location:
        """`location` with its sheet name and heading path cut to `max_header_chars` together (outermost first)."""
        limit = self.limits.max_header_chars
        if len(location.sheet or "") + sum(map(len, location.headings)) <= limit:
            return location
        self.note(f"sheet names and heading paths cut to {limit} characters (--max-header-chars)")
        sheet = location.sheet[:limit] if location.sheet else location.sheet
        room, headings = limit - len(sheet or ""), []
        for heading in location.headings:
            if room <= 0:
                break
            headings.append(heading[:room])
            room -= len(headings[-1])
        return replace(location, sheet=sheet, headings=tuple(headings))

    def capped(self, text: str, limit: int, what: str, option: str) -> str:
        """`text` cut to `limit` characters (the cut noted)."""
        if len(text) <= limit:
            return text
        self.note(f"{what} cut to {limit} characters ({option})")
        return text[:limit]

    def note(self, cut: str) -> None:
        """What was cut, once per kind of cut."""
        if cut not in self.cut:
            self.cut.append(cut)


class Unreadable(Exception):
    """A file that cannot be read: `reason` is the kind (encrypted, corrupt, too large, ...), the message says
    what exactly."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


TEXT_FORMATS = {".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}
PARSED_FORMATS = {".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx", ".csv": "csv"}
SUFFIXES = tuple(TEXT_FORMATS) + tuple(PARSED_FORMATS)
_OFFICE_PARTS = (("word/", "docx"), ("ppt/", "pptx"), ("xl/", "xlsx"))


def format_of(suffix: str, data: bytes, limits: ReaderLimits) -> str:
    """The format a file's content says (a PDF or an Office zip behind any extension), else its extension's
    (`suffix`, lower case), else text where its bytes are text. A zip's directory is checked here, before any part
    is read."""
    if data.startswith(b"%PDF-"):
        return "pdf"
    if data.startswith(b"PK\x03\x04"):
        return _zip_format(suffix, data, limits)
    if suffix in (".pdf", ".docx", ".pptx", ".xlsx"):
        return "text" if b"\x00" not in data[:8192] else "binary"  # a text file named .pdf is read as text
    if suffix in TEXT_FORMATS or suffix in PARSED_FORMATS:
        return TEXT_FORMATS.get(suffix) or PARSED_FORMATS[suffix]
    from gradfuse.ingest.readers.plain import looks_like_text

    return "text" if looks_like_text(data[:8192]) else "binary"  # README, NEWS, notes.rst: text by their bytes


_OFFICE = ("docx", "pptx", "xlsx")


def _zip_format(suffix: str, data: bytes, limits: ReaderLimits) -> str:
    """An Office kind by its parts' names, "zip" for another archive; the zip is opened once, after its end
    record's count and directory size are checked (Python's reader makes an object per entry: 400,000 entries
    took 450 MB), and an Office file's parts are checked for their uncompressed size before any is read."""
    kind = PARSED_FORMATS.get(suffix, "zip")
    end = zipfile._EndRecData(io.BytesIO(data))  # the stdlib's own end-record reader (zip64 included)
    if end is not None:
        entries, directory = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]
        if entries > limits.max_zip_entries or directory > limits.max_zip_entries * 1024:
            raise Unreadable("too many parts", f"its zip holds {entries} entries ({directory} bytes of directory), "
                                               f"over the limit of {limits.max_zip_entries} (--max-zip-entries)")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            parts = archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        if kind in _OFFICE:
            raise Unreadable("corrupt", f"not a readable {kind} (zip: {error})") from None
        return kind
    kind = next((office for prefix, office in _OFFICE_PARTS if any(p.filename.startswith(prefix) for p in parts)),
                "zip")
    unzipped = sum(part.file_size for part in parts)
    if kind in _OFFICE and unzipped > limits.max_unzipped_mb * 1024 * 1024:
        raise Unreadable("zip bomb", f"its parts unzip to {unzipped / 1024 / 1024:.0f} MB, over the limit of "
                                     f"{limits.max_unzipped_mb} MB (--max-unzipped-mb)")
    return kind


def check_ocr(limits: ReaderLimits) -> None:
    """OCR asked for where it cannot run is an error before anything is read, not pages silently left out."""
    import importlib.util
    import shutil

    if limits.ocr and (shutil.which("tesseract") is None or importlib.util.find_spec("pytesseract") is None):
        raise ValueError("--ocr needs Tesseract and pytesseract: apt-get install tesseract-ocr, and pip install "
                         "'gradfuse[ocr]'")


def check_size(size: int, limits: ReaderLimits) -> None:
    if size > limits.max_file_mb * 1024 * 1024:
        raise Unreadable("too large", f"{size / 1024 / 1024:.0f} MB, over the limit of {limits.max_file_mb} MB "
                                      "(--max-file-mb)")


def parse(data: bytes, suffix: str, name: str, limits: ReaderLimits) -> tuple[str, Parsed | None]:
    """(format, its parse) of one file (what the worker process runs): its bytes, read from the descriptor that
    was checked, its extension and `name`, its path inside the folder. The parse is None for a binary file or an
    archive that is not an Office file (skipped as binary)."""
    kind = format_of(suffix, data, limits)
    if kind in ("binary", "zip"):
        return kind, None
    reading = Reading(limits)
    parsed = _read(data, kind, name, reading)
    title = reading.capped(parsed.title, limits.max_header_chars, "title", "--max-header-chars")
    return kind, replace(parsed, title=title, cut=tuple(reading.cut))


def _read(data: bytes, kind: str, name: str, reading: Reading) -> Parsed:
    if kind in ("text", "markdown", "html"):
        from gradfuse.ingest.readers.markup import read_html, read_markdown
        from gradfuse.ingest.readers.plain import decode, read_text

        text, fallback = decode(data)
        reader = {"text": read_text, "markdown": read_markdown, "html": read_html}[kind]
        return replace(reader(text, name, reading), decoded_with_fallback=fallback)
    if kind == "pdf":
        from gradfuse.ingest.readers.pdf import read_pdf

        return read_pdf(data, name, reading)
    if kind == "docx":
        from gradfuse.ingest.readers.word import read_docx

        return read_docx(data, name, reading)
    if kind == "pptx":
        from gradfuse.ingest.readers.slides import read_pptx

        return read_pptx(data, name, reading)
    if kind == "xlsx":
        from gradfuse.ingest.readers.sheets import read_xlsx

        return read_xlsx(data, name, reading)
    if kind == "csv":
        from gradfuse.ingest.readers.sheets import read_csv

        return read_csv(data, name, reading)
    raise Unreadable("unsupported", f"a {kind} file is not a format gradfuse reads")
