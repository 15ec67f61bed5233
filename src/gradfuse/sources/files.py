"""A folder of files as documents: every file of a format gradfuse reads (sources/readers/), each cut into
chunks that keep the file, the page or slide or sheet and rows, the heading path and the character span.

A file is opened first and checked on its descriptor (a link out of the folder, or one swapped in after the
listing, is never read from outside it); its format comes from its content where that says one. Parsed formats
go through a worker process with a deadline (readers/isolation.py), and what a file parsed to is cached by its
content's hash, so a re-index parses only the files that changed.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from gradfuse.candidate import Location
from gradfuse.sources.documents import Document, IngestError, IngestReport, chunk_text
from gradfuse.sources.readers import (
    SUFFIXES,
    TEXT_FORMATS,
    Parsed,
    ReaderLimits,
    Unit,
    Unreadable,
    check_ocr,
    check_size,
    check_unzipped,
    format_of,
)
from gradfuse.sources.readers.isolation import ParserWorker
from gradfuse.sources.readers.markup import read_html, read_markdown
from gradfuse.sources.readers.plain import read_text

PARSE_VERSION = 2  # bump when a reader's output changes, so cached parses are not reused


def read_files(folder: Path, report: IngestReport, *, words: int, overlap: int, links_outside: bool = False,
               limits: ReaderLimits | None = None, cache: Path | None = None) -> Iterator[Document]:
    """The chunks of every readable file under `folder`, in path order, each named `<relative path>#<n>`. A file
    that cannot be read is skipped and reported with its reason; `cache`: a folder for parsed files."""
    if not folder.is_dir():
        raise IngestError(f"{folder} is not a folder")
    limits = limits or ReaderLimits()
    try:
        check_ocr(limits)
    except ValueError as error:
        raise IngestError(str(error)) from None
    root = folder.resolve()
    with ParserWorker() as worker:
        for path in _walk(folder):
            relative = path.relative_to(folder).as_posix()
            parsed = _read_one(path, relative, root, report, worker, limits, links_outside, cache)
            if parsed is None:
                continue
            title, content = parsed
            chunks = list(_chunks(relative, title, content, words, overlap))
            if not chunks:
                report.skipped_empty.append(relative)
                continue
            yield from chunks


def _read_one(path, relative, root, report, worker, limits, links_outside, cache) -> tuple[str, Parsed] | None:
    with _opened(path, root, links_outside) as (handle, outside):
        if outside:
            report.skipped_links_outside.append(relative)
            return None
        if handle is None:  # not a regular file (a FIFO swapped in)
            report.skipped_binary.append(relative)
            return None
        head = handle.read(8192)
        if path.suffix.lower() in TEXT_FORMATS and _binary(head):  # known before the rest is read (1 GB of zeros)
            report.skipped_binary.append(relative)
            return None
        try:
            check_size(os.fstat(handle.fileno()).st_size, limits)
        except Unreadable as error:
            report.skipped_unreadable.append((relative, error.reason, str(error)))
            return None
        data = head + handle.read()
    kind = format_of(path, data)
    suffix_kind = TEXT_FORMATS.get(path.suffix.lower()) or path.suffix.lower().lstrip(".")
    if kind != suffix_kind and kind not in ("binary", "zip"):
        report.read_by_content.append(f"{relative} (read as {kind})")
    if kind in ("binary", "zip"):
        report.skipped_binary.append(relative)
        return None
    try:
        if kind in ("text", "markdown", "html"):  # binary data was turned away above (suffix) or by format_of
            result = _read_markup(_decode(data, relative, report), kind, relative)
        else:
            check_unzipped(data, kind, limits)
            result = (Path(relative).stem, _parsed(worker, data, kind, relative, limits, cache))
    except Unreadable as error:
        report.skipped_unreadable.append((relative, error.reason, str(error)))
        return None
    report.formats[kind] = report.formats.get(kind, 0) + 1
    report.pages_without_text += [f"{relative} p. {page}" for page in result[1].pages_without_text]
    report.pages_read_by_ocr += result[1].pages_read_by_ocr
    return result


def _read_markup(text: str, kind: str, relative: str) -> tuple[str, Parsed]:
    stem = Path(relative).stem
    if kind == "html":
        title, parsed = read_html(text, relative)
        return title or stem, parsed
    if kind == "markdown":
        parsed = read_markdown(text, relative)
        first = next((u.location.headings[0] for u in parsed.units if u.location.headings), None)
        return first or stem, parsed
    return stem, read_text(text, relative)


def _parsed(worker: ParserWorker, data: bytes, kind: str, relative: str, limits: ReaderLimits,
            cache: Path | None) -> Parsed:
    """The worker's parse of `data`, or the cached one for the same bytes, format and limits."""
    key = hashlib.sha256(json.dumps([PARSE_VERSION, kind, relative, asdict(limits)]).encode() + data).hexdigest()
    stored = cache / f"{key}.json" if cache is not None else None
    if stored is not None and stored.is_file():
        return _from_json(json.loads(stored.read_text(encoding="utf-8")))
    parsed = worker.parse(data, kind, relative, limits)
    if stored is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        temporary = stored.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(_to_json(parsed)), encoding="utf-8")
        temporary.replace(stored)
    return parsed


def _to_json(parsed: Parsed) -> dict:
    return {"text": parsed.text, "pages_without_text": list(parsed.pages_without_text),
            "pages_read_by_ocr": parsed.pages_read_by_ocr,
            "units": [{"text": u.text, "location": u.location.to_json(), "start": u.start, "table": u.table}
                      for u in parsed.units]}


def _from_json(stored: dict) -> Parsed:
    units = [Unit(u["text"], Location.from_json(u["location"]), u["start"], u["table"]) for u in stored["units"]]
    return Parsed(units, stored["text"], tuple(stored["pages_without_text"]), stored["pages_read_by_ocr"])


def _chunks(relative: str, title: str, parsed: Parsed, words: int, overlap: int) -> Iterator[Document]:
    """Each unit cut by words (a table chunk kept whole), numbered through the file; spans index the file's
    text (the whole file for text formats; pages, sections or slides joined for parsed ones)."""
    number = 0
    for unit in parsed.units:
        if not unit.text.strip():
            continue
        pieces = [(0, len(unit.text))] if unit.table else chunk_text(unit.text, words=words, overlap=overlap)
        for start, end in pieces:
            span = (unit.start + start, unit.start + end) if unit.start is not None else None
            yield Document(f"{relative}#{number}", unit.text[start:end], title, relative, span, unit.location)
            number += 1


def _walk(folder: Path) -> list[Path]:
    """The readable files under `folder`, sorted, without recursion (a folder 1,200 levels deep is fine) and
    without entering linked folders (as Path.rglob)."""
    found, pending = [], [folder]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif Path(entry.name).suffix.lower() in SUFFIXES and entry.is_file():
                    found.append(Path(entry.path))
    return sorted(found)


@contextmanager
def _opened(path: Path, root: Path, links_outside: bool):
    """(a binary handle on `path`, or None when it is not a regular file; whether it lies outside `root`). The
    check is on the opened descriptor, not on the name: checking the name, then opening it, let a file swapped for
    a link in between be read from outside the folder. O_NONBLOCK: a FIFO swapped in does not block the build."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    handle = os.fdopen(descriptor, "rb")
    try:
        outside = not links_outside and not Path(os.readlink(f"/proc/self/fd/{descriptor}")).is_relative_to(root)
        yield (handle if stat.S_ISREG(os.fstat(descriptor).st_mode) else None), outside
    finally:
        handle.close()


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 first: its LE BOM starts
# with UTF-16's


def _binary(head: bytes) -> bool:
    """NUL bytes in a file's first 8 KiB, without a BOM that makes them text (UTF-16, UTF-32)."""
    return b"\x00" in head and not any(head.startswith(bom) for bom, _ in _BOMS) and \
        not head.startswith((b"%PDF-", b"PK\x03\x04"))


def _decode(raw: bytes, relative: str, report: IngestReport) -> str:
    """The text of a text file: by its BOM, else UTF-8, else Windows-1252 or latin-1 (counted)."""
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), None)
    try:
        return raw.decode(encoding or "utf-8")
    except UnicodeDecodeError:
        # Legacy files are usually Windows-1252; latin-1 maps every byte, so nothing is lost either way.
        report.decoded_with_fallback.append(relative)
        try:
            return raw.decode("cp1252")
        except UnicodeDecodeError:
            return raw.decode("latin-1")
