"""One reader per file format behind one interface: a file in, its units out, each a piece of text with the
place it stands (`gradfuse.candidate.Location`: page, slide, sheet and rows, headings).

- plain.py: .txt; markup.py: Markdown (cut along its headings) and HTML (boilerplate removed by trafilatura,
  then cut along headings);
- pdf.py: text per page (pypdfium2), headings from the document's outline; pages without a text layer counted;
- word.py: .docx paragraphs under their heading path, tables as tables (python-docx);
- slides.py: .pptx, one unit per slide with its title and notes (python-pptx);
- sheets.py: .xlsx (openpyxl) and .csv: chunks of rows that each repeat the header row.

A file's format is read from its first bytes where they say it (a PDF's "%PDF-", a zip's Word, PowerPoint or
Excel parts), else from its extension. The formats read through a parser (PDF, Office) run in a worker process
with a deadline per file (isolation.py), after checks of size, pages and a zip's uncompressed size: a file that
fails one is skipped with its reason, and the rest of the folder is read.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from gradfuse.candidate import Location
from gradfuse.checked import FILE_SETTINGS, Count, Flag, Seconds


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
    max_file_mb: Count = 200  # any file
    max_pages: Count = 2000  # of a PDF, or slides of a deck
    max_rows: Count = 1_000_000  # of one spreadsheet, all sheets together
    max_unzipped_mb: Count = 1000  # an Office file's parts, uncompressed (a zip bomb says less than it holds)
    deadline_s: Seconds = 60.0  # to parse one file
    ocr: Flag = False  # read PDF pages without a text layer with Tesseract (else they are counted and reported)


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


def format_of(path: Path, data: bytes) -> str:
    """The format the file's content (`data`) says (a PDF or an Office zip behind any extension), else its
    extension's."""
    if data.startswith(b"%PDF-"):
        return "pdf"
    if data.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            return PARSED_FORMATS.get(path.suffix.lower(), "zip")
        for prefix, kind in _OFFICE_PARTS:
            if any(name.startswith(prefix) for name in names):
                return kind
        return "zip"
    suffix = path.suffix.lower()
    if suffix in (".pdf", ".docx", ".pptx", ".xlsx"):
        return "text" if b"\x00" not in data[:8192] else "binary"  # a text file named .pdf is read as text
    return TEXT_FORMATS.get(suffix) or PARSED_FORMATS.get(suffix) or "binary"


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


def check_unzipped(data: bytes, kind: str, limits: ReaderLimits) -> None:
    """An Office file's parts, uncompressed, as its zip directory declares them: checked before any is read."""
    if kind in ("docx", "pptx", "xlsx"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                unzipped = sum(info.file_size for info in archive.infolist())
        except zipfile.BadZipFile as error:
            raise Unreadable("corrupt", f"not a readable {kind} (zip: {error})") from None
        if unzipped > limits.max_unzipped_mb * 1024 * 1024:
            raise Unreadable("zip bomb", f"its parts unzip to {unzipped / 1024 / 1024:.0f} MB, over the limit of "
                                         f"{limits.max_unzipped_mb} MB (--max-unzipped-mb)")


def parse(data: bytes, kind: str, name: str, limits: ReaderLimits) -> Parsed:
    """One file of a parsed format (what the worker process runs): its bytes, read from the descriptor that
    was checked, and `name`, its path inside the folder."""
    if kind == "pdf":
        from gradfuse.sources.readers.pdf import read_pdf

        return read_pdf(data, name, limits)
    if kind == "docx":
        from gradfuse.sources.readers.word import read_docx

        return read_docx(data, name)
    if kind == "pptx":
        from gradfuse.sources.readers.slides import read_pptx

        return read_pptx(data, name, limits)
    if kind == "xlsx":
        from gradfuse.sources.readers.sheets import read_xlsx

        return read_xlsx(data, name, limits)
    if kind == "csv":
        from gradfuse.sources.readers.sheets import read_csv

        return read_csv(data, name, limits)
    raise Unreadable("unsupported", f"a {kind} file is not a format gradfuse reads")
