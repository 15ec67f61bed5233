"""Typed documents from user inputs: BEIR folders and JSONL here, folders of files in files.py (one reader per
format in readers/); and how long documents are cut into chunks that keep their provenance."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gradfuse.access import InvalidReader, document_readers
from gradfuse.candidate import Location


class IngestError(ValueError):
    """An input cannot be read; the message names the file (and line) at fault."""


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: str
    text: str
    title: str = ""
    parent_id: str | None = None
    span: tuple[int, int] | None = None
    location: Location | None = None
    readers: tuple[str, ...] = ()  # who may read it (names and groups); empty: whoever may read its source


@dataclass
class IngestReport:
    """What a reader skipped or had to repair, so nothing is dropped silently."""

    skipped_empty: list[str] = field(default_factory=list)
    skipped_malformed: list[str] = field(default_factory=list)
    decoded_with_fallback: list[str] = field(default_factory=list)
    skipped_links_outside: list[str] = field(default_factory=list)  # links that lead out of the indexed folder
    skipped_binary: list[str] = field(default_factory=list)  # files with a text suffix that hold binary data
    chunked_long_records: list[str] = field(default_factory=list)  # records cut into chunks, as files are
    skipped_unreadable: list[tuple[str, str, str]] = field(default_factory=list)  # (file, reason, detail)
    pages_without_text: list[str] = field(default_factory=list)  # "report.pdf p. 3": scanned, no text layer
    read_by_content: list[str] = field(default_factory=list)  # files whose content says another format
    cut_to_limits: list[str] = field(default_factory=list)  # "big.csv: repeated header cut to 1000 characters (...)"
    pages_read_by_ocr: int = 0
    unmatched_readers: list[str] = field(default_factory=list)  # `readers` patterns no file matched
    formats: dict[str, int] = field(default_factory=dict)  # files read, by format

    def summary(self) -> dict[str, int]:
        counts = {name: len(getattr(self, name)) for name in (
            "skipped_empty", "skipped_malformed", "decoded_with_fallback", "skipped_links_outside",
            "skipped_binary", "chunked_long_records", "skipped_unreadable", "pages_without_text",
            "read_by_content", "cut_to_limits")}
        return {**counts, "pages_read_by_ocr": self.pages_read_by_ocr}

    def merge(self, other: IngestReport) -> None:
        """Add what `other` (one file's reading, say) reported."""
        for name, value in vars(other).items():
            if isinstance(value, list):
                getattr(self, name).extend(value)
            elif isinstance(value, dict):
                for key, count in value.items():
                    self.formats[key] = self.formats.get(key, 0) + count
            else:
                setattr(self, name, getattr(self, name) + value)

    def to_json(self) -> str:
        """Only what it holds (most files' reports are empty but for their format)."""
        return json.dumps({name: value for name, value in vars(self).items() if value}, ensure_ascii=False)

    @staticmethod
    def from_json(stored: str) -> IngestReport:
        fields = json.loads(stored)
        fields["skipped_unreadable"] = [tuple(entry) for entry in fields.get("skipped_unreadable", [])]
        return IngestReport(**fields)

    def details(self) -> dict:
        """What a BuildReport carries of this report."""
        return {"ingest": self.summary(), "formats": dict(self.formats), "skipped": list(self.skipped_unreadable),
                "cut": list(self.cut_to_limits)}


class _BadRecord(ValueError):
    pass


def read_jsonl(
    path: Path,
    report: IngestReport,
    *,
    id_field: str | tuple[str, ...] = "id",
    text_field: str = "text",
    title_field: str = "title",
    readers_field: str = "readers",
    skip_malformed: bool = False,
) -> Iterator[Document]:
    """One document per line. A bad line (not UTF-8, not JSON, not an object, a missing, null or blank id, a
    text that is not a string, a lone surrogate escape, readers that are not a list of names) raises IngestError
    naming file and line, or is skipped and counted. `id_field` may name alternatives, the first present is used
    (BEIR writes `_id`); `readers_field` lists who may read a record (docs/access.md)."""
    id_fields = (id_field,) if isinstance(id_field, str) else id_field
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                record = _record(raw, id_fields, text_field, title_field, readers_field)
            except _BadRecord as error:
                problem = f"{path}:{line_number}: {error}"
                if not skip_malformed:
                    raise IngestError(problem) from None
                report.skipped_malformed.append(problem)
                continue
            if record is None:
                continue
            doc_id, text, title, readers = record
            if not (text.strip() or title.strip()):
                report.skipped_empty.append(f"{path}:{line_number} ({doc_id})")
                continue
            yield Document(doc_id=doc_id, text=text, title=title, readers=readers)


def _record(raw: bytes, id_fields: tuple[str, ...], text_field: str, title_field: str, readers_field: str,
            ) -> tuple[str, str, str, tuple[str, ...]] | None:
    """(id, text, title, readers) of one line, None for a blank line; _BadRecord says what is wrong."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _BadRecord(f"not UTF-8 text (byte {raw[error.start]:#04x} at column {error.start + 1}); "
                         "convert the file to UTF-8") from None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise _BadRecord(f"invalid JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise _BadRecord("JSON nested too deeply to read") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise _BadRecord("a number too long to read (over 4,300 digits)") from None
    if not isinstance(record, dict):
        raise _BadRecord(f"expected a JSON object, got {type(record).__name__}")
    present = [f for f in id_fields if f in record]
    if not present:
        raise _BadRecord(f"missing field {id_fields[0]!r}")
    doc_id = record[present[0]]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise _BadRecord(f"field {present[0]!r} is {json.dumps(doc_id)}, not a string or an integer")
    doc_id = str(doc_id)
    if not doc_id.strip():
        raise _BadRecord(f"field {present[0]!r} is blank")
    if text_field not in record:
        raise _BadRecord(f"missing field {text_field!r}")
    text, title = record[text_field], record.get(title_field) or ""
    for name, value in ((text_field, text), (title_field, title)):
        if not isinstance(value, str):
            raise _BadRecord(f"field {name!r} is {type(value).__name__}, not a string")
    for value in (doc_id, text, title):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _BadRecord("a lone surrogate escape (such as \\ud800) is not text") from None
    try:
        readers = document_readers(record.get(readers_field), f"field {readers_field!r}")
    except InvalidReader as error:  # a field of that name may mean something else in this corpus
        raise _BadRecord(f"{error} (a field that names no readers: readers_field = \"\" reads none)") from None
    return doc_id, text, title, readers


def read_beir_corpus(folder: Path, report: IngestReport, *, readers_field: str = "readers",
                     skip_malformed: bool = False) -> Iterator[Document]:
    corpus = folder / "corpus.jsonl"
    if not corpus.is_file():
        raise IngestError(f"{folder} is not a BEIR folder: {corpus.name} is missing")
    return read_jsonl(corpus, report, id_field=("id", "_id"), readers_field=readers_field,
                      skip_malformed=skip_malformed)


_WORD = re.compile(r"\S+")


CHARS_PER_WORD = 12  # a chunk's character cap is this many per word: English averages about 6 with its space


def chunk_text(text: str, *, words: int, overlap: int) -> Iterator[tuple[int, int]]:
    """Character spans of windows of `words` words, consecutive windows sharing `overlap` words. A window longer
    than `words` x CHARS_PER_WORD characters (text without spaces: CJK, base64, one 10 MB word) is cut by
    characters too, with the same share of overlap. A stream: only one window's word bounds are held (a list of
    every word's bounds took 1.3 GB for a 20 MB file)."""
    if overlap >= words:
        raise ValueError(f"overlap ({overlap}) must be smaller than the chunk size ({words} words)")
    return _windows(text, words, overlap)


def _windows(text: str, words: int, overlap: int) -> Iterator[tuple[int, int]]:
    window: list[tuple[int, int]] = []
    fresh = 0  # words of the window not yet in an emitted chunk
    for match in _WORD.finditer(text):
        window.append((match.start(), match.end()))
        fresh += 1
        if len(window) == words:
            yield from _by_characters(window[0][0], window[-1][1], words * CHARS_PER_WORD, overlap * CHARS_PER_WORD)
            del window[: words - overlap]
            fresh = 0
    if fresh:
        yield from _by_characters(window[0][0], window[-1][1], words * CHARS_PER_WORD, overlap * CHARS_PER_WORD)


def _by_characters(start: int, end: int, size: int, overlap: int) -> list[tuple[int, int]]:
    if end - start <= size:
        return [(start, end)]
    return [(first, min(first + size, end)) for first in range(start, end - overlap, size - overlap)]


def chunk_documents(documents: Iterator[Document], *, words: int, overlap: int) -> Iterator[Document]:
    """Cut long documents into overlapping chunks (`<id>#<n>`) that keep their parent id and character span."""
    for document in documents:
        for index, (start, end) in enumerate(chunk_text(document.text, words=words, overlap=overlap)):
            yield Document(
                doc_id=f"{document.doc_id}#{index}",
                text=document.text[start:end],
                title=document.title,
                parent_id=document.doc_id,
                span=(start, end),
                readers=document.readers,
            )
