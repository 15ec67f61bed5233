"""A folder of files as documents: every file of a format gradfuse reads (ingest/readers/), each cut into
chunks that keep the file, the page or slide or sheet and rows, the heading path and the character span.

A file is opened first and checked on its descriptor (a link out of the folder, or one swapped in after the
listing, is never read from outside it); its bytes go to the worker process (readers/isolation.py), which reads
its format from its content where that says one and parses it under the limits. What a parser made of a file
is cached by its content's hash, in a folder of the source's own (owner-only from its first write; entries no
longer used by a build are removed with it), so a re-index parses only the files that changed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from itertools import islice
from dataclasses import asdict
from pathlib import Path

from gradfuse.candidate import Location
from gradfuse.folders import private_folder
from gradfuse.ingest.documents import Document, IngestError, IngestReport, chunk_text
from gradfuse.ingest.readers import (
    PARSED_FORMATS,
    SUFFIXES,
    TEXT_FORMATS,
    Parsed,
    ReaderLimits,
    Unit,
    Unreadable,
    check_ocr,
    check_size,
)
from gradfuse.ingest.readers.isolation import ParserWorker
from gradfuse.ingest.readers.plain import BOMS

PARSE_VERSION = 4  # bump when a reader's output changes, so cached parses are not reused


def read_files(folder: Path, report: IngestReport, *, words: int, overlap: int, links_outside: bool = False,
               limits: ReaderLimits | None = None, cache: Path | None = None) -> Iterator[Document]:
    """The chunks of every readable file under `folder`, in path order, each named `<relative path>#<n>`. A file
    that cannot be read is skipped and reported with its reason; `cache`: the source's folder for parsed files
    (entries this read did not use are removed once every file was read)."""
    if not folder.is_dir():
        raise IngestError(f"{folder} is not a folder")
    limits = limits or ReaderLimits()
    try:
        check_ocr(limits)
    except ValueError as error:
        raise IngestError(str(error)) from None
    root, used = folder.resolve(), set()
    with ParserWorker() as worker:
        for path in _walk(folder, report):
            relative = path.relative_to(folder).as_posix()
            try:
                parsed = _read_one(path, relative, root, report, worker, limits, links_outside, cache, used)
            except OSError as error:  # gone since the listing, or not ours to read: this file only
                report.skipped_unreadable.append((relative, "unreadable", error.strerror or type(error).__name__))
                continue
            if parsed is None:
                continue
            chunks = list(islice(_chunks(relative, parsed.title or Path(relative).stem, parsed, words, overlap),
                                 limits.max_chunks + 1))
            if len(chunks) > limits.max_chunks:
                report.skipped_unreadable.append((relative, "too many chunks", f"it makes over {limits.max_chunks} "
                                                                               "chunks (--max-chunks)"))
                continue
            if not chunks:
                report.skipped_empty.append(relative)
                continue
            yield from chunks
    if cache is not None and cache.is_dir():
        for entry in cache.iterdir():  # a deleted file's text does not stay behind
            if entry.name not in used:
                entry.unlink(missing_ok=True)


def _read_one(path, relative, root, report, worker, limits, links_outside, cache, used) -> Parsed | None:
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
    suffix = path.suffix.lower()
    try:
        kind, parsed = _parsed(worker, data, suffix, relative, limits, cache, used)
    except Unreadable as error:
        report.skipped_unreadable.append((relative, error.reason, str(error)))
        return None
    if kind != (TEXT_FORMATS.get(suffix) or suffix.lstrip(".")) and kind not in ("binary", "zip"):
        report.read_by_content.append(f"{relative} (read as {kind})")
    if parsed is None:
        report.skipped_binary.append(relative)
        return None
    report.formats[kind] = report.formats.get(kind, 0) + 1
    report.pages_without_text += [f"{relative} p. {page}" for page in parsed.pages_without_text]
    report.pages_read_by_ocr += parsed.pages_read_by_ocr
    report.cut_to_limits += [f"{relative}: {cut}" for cut in parsed.cut]
    if parsed.decoded_with_fallback:
        report.decoded_with_fallback.append(relative)
    return parsed


def _parsed(worker: ParserWorker, data: bytes, suffix: str, relative: str, limits: ReaderLimits,
            cache: Path | None, used: set[str]) -> tuple[str, Parsed | None]:
    """The worker's (format, parse) of `data`, or the cached one for the same bytes, name and limits (kept for
    the formats a parser reads; text is read again, which costs less than keeping a copy)."""
    key = hashlib.sha256(json.dumps([PARSE_VERSION, suffix, relative, asdict(limits)]).encode() + data).hexdigest()
    stored = cache / f"{key}.json" if cache is not None else None
    if stored is not None:
        kept = _read_entry(stored)
        if kept is not None:
            used.add(stored.name)
            return kept
    kind, parsed = worker.parse(data, suffix, relative, limits)
    if stored is not None and kind in PARSED_FORMATS.values():
        _write_entry(stored, kind, parsed)
        used.add(stored.name)
    return kind, parsed


def _read_entry(stored: Path) -> tuple[str, Parsed] | None:
    """A cached parse; an entry that cannot be read (truncated, from another version) is removed: a miss."""
    try:
        kept = json.loads(stored.read_text(encoding="utf-8"))
        return kept["kind"], _from_json(kept["parsed"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        stored.unlink(missing_ok=True)
        return None


def _write_entry(stored: Path, kind: str, parsed: Parsed) -> None:
    """Written owner-only, synced, then renamed into place: a crash leaves either no entry or a whole one, and no
    temporary file; a full disk is one clear error."""
    private_folder(stored.parent)
    temporary = stored.with_name(f"{stored.stem}.{os.getpid()}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"kind": kind, "parsed": _to_json(parsed)}, handle, ensure_ascii=False)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(stored)
    except BaseException as error:
        with suppress(OSError):
            temporary.unlink()
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise IngestError(f"the disk is full (writing the parse cache in {stored.parent}): free some space "
                              "and index again") from None
        raise


def _to_json(parsed: Parsed) -> dict:
    """A parse as kept: not its text nor the units' starts in it, which `Parsed.joined` made and makes again
    (every format cached is joined so, or all table chunks)."""
    return {"pages_without_text": list(parsed.pages_without_text),
            "pages_read_by_ocr": parsed.pages_read_by_ocr, "title": parsed.title, "cut": list(parsed.cut),
            "units": [{"text": u.text, "location": u.location.to_json(), "table": u.table} for u in parsed.units]}


def _from_json(stored: dict) -> Parsed:
    units = [Unit(u["text"], Location.from_json(u["location"]), table=u["table"]) for u in stored["units"]]
    return Parsed.joined(units, pages_without_text=tuple(stored["pages_without_text"]),
                         pages_read_by_ocr=stored["pages_read_by_ocr"], title=stored["title"],
                         cut=tuple(stored["cut"]))


def _chunks(relative: str, title: str, parsed: Parsed, words: int, overlap: int) -> Iterator[Document]:
    """Each unit cut by words (a table chunk kept whole), numbered through the file; spans index the file's
    text (the whole file for text formats; pages, sections or slides joined for parsed ones)."""
    number = 0
    for unit in parsed.units:
        if not unit.text.strip():
            continue
        pieces = [(0, len(unit.text))] if unit.table else chunk_text(unit.text, words=words, overlap=overlap)
        for start, end in pieces:
            if unit.text[start:end].isspace():  # a run of spaces cut by characters holds nothing to find
                continue
            span = (unit.start + start, unit.start + end) if unit.start is not None else None
            yield Document(f"{relative}#{number}", unit.text[start:end], title, relative, span, unit.location)
            number += 1


def _walk(folder: Path, report: IngestReport) -> list[Path]:
    """The readable files under `folder`, sorted, without recursion (a folder 1,200 levels deep is fine) and
    without entering linked folders (as Path.rglob); a folder that cannot be listed is reported and left out."""
    found, pending = [], [folder]
    while pending:
        listed = pending.pop()
        try:
            entries = list(os.scandir(listed))
        except OSError as error:
            if listed == folder:
                raise IngestError(f"{folder} cannot be read ({error.strerror})") from None
            report.skipped_unreadable.append((f"{listed.relative_to(folder).as_posix()}/", "unreadable",
                                              error.strerror or type(error).__name__))
            continue
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


def _binary(head: bytes) -> bool:
    """NUL bytes in a file's first 8 KiB, without a BOM that makes them text (UTF-16, UTF-32)."""
    return b"\x00" in head and not any(head.startswith(bom) for bom, _ in BOMS) and \
        not head.startswith((b"%PDF-", b"PK\x03\x04"))
