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
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from itertools import islice
from dataclasses import asdict, dataclass
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
from gradfuse.ingest.readers.isolation import ParserWorker, kept_parser
from gradfuse.ingest.readers.plain import BOMS, looks_like_text

# Bump when a reader's output or the cutting of files into chunks changes: cached parses are not reused, and folder
# sources are written whole again (indexing/folder_sync.py)
PARSE_VERSION = 4


@dataclass(frozen=True)
class ListedFile:
    """A file of the folder as listed: its path in the folder and what a sync compares to know it unchanged."""

    relative: str
    size: int
    mtime_ns: int
    ctime_ns: int  # moves on every write and rename, and no program can set it back
    inode: int

    @property
    def stamp(self) -> tuple[int, int, int, int]:
        return self.size, self.mtime_ns, self.ctime_ns, self.inode


@dataclass
class FileRead:
    """One file read: its passages, what its reading adds to the build's report, the hash of its bytes (None where
    it was skipped before they were read) and the parse-cache entry it used."""

    documents: list[Document]
    report: IngestReport
    digest: str | None = None
    parse_entry: str | None = None
    unchanged: bool = False  # its bytes hash to the digest it was asked about: nothing was parsed
    retry: bool = False  # it could not be opened now (or changed while it was): read it again next time


def list_files(folder: Path, report: IngestReport, *, hidden: bool = False,
               gitignore: bool = True) -> list[ListedFile]:
    """Every file under `folder`, in path order, with its stat (followed through a link); a folder that cannot be
    listed is reported and left out. Skipped and reported unless `hidden`: files and folders whose names start
    with a dot (.git, .venv, .env) and tool folders (`TOOL_FOLDERS`); unless not `gitignore`: what the folder's
    .gitignore files exclude."""
    if not folder.is_dir():
        raise IngestError(f"{folder} is not a folder")
    listed = []
    for relative, found in _walk(folder, report, hidden, gitignore):
        listed.append(ListedFile(relative, found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino))
    return listed


def read_files(folder: Path, report: IngestReport, *, words: int, overlap: int, links_outside: bool = False,
               limits: ReaderLimits | None = None, cache: Path | None = None, hidden: bool = False,
               gitignore: bool = True) -> Iterator[Document]:
    """The chunks of every readable file under `folder`, in path order, each named `<relative path>#<n>`. A file
    that cannot be read is skipped and reported with its reason; `cache`: the source's folder for parsed files
    (entries this read did not use are removed once every file was read)."""
    limits = limits or ReaderLimits()
    used = set()
    with FileReader(folder, words=words, overlap=overlap, limits=limits, links_outside=links_outside,
                    cache=cache) as reader:
        for listed in list_files(folder, report, hidden=hidden, gitignore=gitignore):
            read = reader.read(listed.relative)
            report.merge(read.report)
            used.add(read.parse_entry)
            yield from read.documents
    prune_parse_cache(cache, used)


def prune_parse_cache(cache: Path | None, used: set[str | None]) -> None:
    """Remove the parse-cache entries no current file uses: a deleted file's text does not stay behind."""
    if cache is not None and cache.is_dir():
        for entry in cache.iterdir():
            if entry.name not in used:
                entry.unlink(missing_ok=True)


class FileReader:
    """Reads files of one folder one at a time, in a parser worker started on the first file that must be parsed
    (a sync that finds nothing changed starts none)."""

    def __init__(self, folder: Path, *, words: int, overlap: int, limits: ReaderLimits, links_outside: bool,
                 cache: Path | None):
        try:
            check_ocr(limits)
        except ValueError as error:
            raise IngestError(str(error)) from None
        self.folder, self._root = folder, folder.resolve()
        self._words, self._overlap, self._limits = words, overlap, limits
        self._links_outside, self._cache = links_outside, cache
        self._worker: ParserWorker | None = None

    def __enter__(self) -> FileReader:
        return self

    def __exit__(self, *exc) -> None:
        if self._worker is not None:
            self._worker.__exit__(*exc)

    def _parser(self) -> ParserWorker:
        kept = kept_parser()
        if kept is not None:
            return kept
        if self._worker is None:
            self._worker = ParserWorker().__enter__()
        return self._worker

    def read(self, relative: str, *, known_digest: str | None = None, inode: int | None = None) -> FileRead:
        """The file's passages and report; `known_digest`: where its bytes still hash to it, nothing is parsed
        and the read comes back `unchanged`; `inode`: the file listed (a path that leads elsewhere now, a link
        retargeted since, is not read: its readers were decided by what it led to)."""
        report, limits = IngestReport(), self._limits
        try:
            data = _read_bytes(self.folder / relative, relative, self._root, report, limits, self._links_outside,
                               inode)
        except OSError as error:  # gone since the listing, or not ours to read: this file only, this time
            report.skipped_unreadable.append((relative, "unreadable", error.strerror or type(error).__name__))
            return FileRead([], report, retry=True)
        if data is None:
            return FileRead([], report)
        digest = hashlib.sha256(data).hexdigest()
        if digest == known_digest:
            return FileRead([], report, digest, unchanged=True)
        used: set[str] = set()
        parsed = _parse(data, relative, report, self._parser, limits, self._cache, used)
        read = FileRead([], report, digest, next(iter(used), None))
        if parsed is None:
            return read
        chunks = list(islice(_chunks(relative, parsed.title or Path(relative).stem, parsed, self._words,
                                     self._overlap), limits.max_chunks + 1))
        if len(chunks) > limits.max_chunks:
            report.skipped_unreadable.append((relative, "too many chunks", f"it makes over {limits.max_chunks} "
                                                                           "chunks (--max-chunks)"))
        elif not chunks:
            report.skipped_empty.append(relative)
        else:
            read.documents = chunks
        return read


def _read_bytes(path: Path, relative: str, root: Path, report: IngestReport, limits: ReaderLimits,
                links_outside: bool, inode: int | None = None) -> bytes | None:
    """The file's bytes, or None where it is skipped (reported) before they are read."""
    with _opened(path, root, links_outside) as (handle, outside):
        if outside:
            report.skipped_links_outside.append(relative)
            return None
        if handle is None:  # not a regular file (a FIFO swapped in)
            report.skipped_binary.append(relative)
            return None
        if inode is not None and os.fstat(handle.fileno()).st_ino != inode:
            raise OSError(errno.ESTALE, "it changed while the folder was read")
        head = handle.read(8192)
        suffix = path.suffix.lower()
        if suffix in TEXT_FORMATS and _binary(head):  # known before the rest is read (1 GB of zeros)
            report.skipped_binary.append(relative)
            return None
        if suffix not in SUFFIXES and not head.startswith((b"%PDF-", b"PK\x03\x04")):
            if not looks_like_text(head):
                report.skipped_unreadable.append((relative, "not text", f"its name{f' ({suffix})' if suffix else ''}"
                                                  " says no format gradfuse reads, and its bytes are not text"))
                return None
            if _SECRET_NAME.search(path.name) or _PRIVATE_KEY.search(head):
                report.skipped_unreadable.append((relative, "secret", "its name or first lines say a key or "
                                                  "credentials: a file read by its content never indexes one"))
                return None
        try:
            check_size(os.fstat(handle.fileno()).st_size, limits)
        except Unreadable as error:
            report.skipped_unreadable.append((relative, error.reason, str(error)))
            return None
        return head + handle.read()


def _parse(data: bytes, relative: str, report: IngestReport, parser, limits: ReaderLimits, cache: Path | None,
           used: set[str]) -> Parsed | None:
    suffix = Path(relative).suffix.lower()
    try:
        kind, parsed = _parsed(parser, data, suffix, relative, limits, cache, used)
    except Unreadable as error:
        report.skipped_unreadable.append((relative, error.reason, str(error)))
        return None
    expected = TEXT_FORMATS.get(suffix) or PARSED_FORMATS.get(suffix) or "text"  # a name it does not know: text
    if kind != expected and kind not in ("binary", "zip"):
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


def _parsed(parser, data: bytes, suffix: str, relative: str, limits: ReaderLimits,
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
    kind, parsed = parser().parse(data, suffix, relative, limits)
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


# Folders of a tool's own files, skipped as hidden ones are: a package manager's and Python's byte code.
TOOL_FOLDERS = frozenset({"node_modules", "__pycache__"})
_GITIGNORE_BYTES = 64 * 1024  # a .gitignore larger than this is not applied (reported; its folder listed whole)


def _walk(folder: Path, report: IngestReport, hidden: bool = False,
          gitignore: bool = True) -> list[tuple[str, os.stat_result]]:
    """(path in the folder, stat) of the files under `folder` (see `list_files`), in path order, without recursion
    (a folder 1,200 levels deep is fine) and without entering linked folders (as Path.rglob); a folder that cannot
    be listed is reported and left out. Plain strings, not Paths: a sync lists every file of the folder each time."""
    found: list[tuple[str, os.stat_result]] = []
    pending: list[tuple[str, tuple[_Rules, ...]]] = [("", ())]
    while pending:
        listed, rules = pending.pop()
        try:
            entries = list(os.scandir(os.path.join(folder, listed)))
        except OSError as error:
            if not listed:
                raise IngestError(f"{folder} cannot be read ({error.strerror})") from None
            report.skipped_unreadable.append((f"{listed}/", "unreadable", error.strerror or type(error).__name__))
            continue
        if gitignore and (ignore_file := next((e for e in entries if e.name == ".gitignore"), None)):
            rules = (*rules, *_gitignore_rules(ignore_file, listed, report))
        for entry in entries:
            relative = f"{listed}/{entry.name}" if listed else entry.name
            is_folder = entry.is_dir(follow_symlinks=False)
            shown = f"{relative}/" if is_folder else relative
            if not hidden and (entry.name.startswith(".") or (is_folder and entry.name in TOOL_FOLDERS)):
                report.skipped_unreadable.append((shown, "hidden", "a hidden file or a tool's folder (the source's "
                                                                   "hidden option reads them)"))
            elif rules and _ignored(rules, relative, is_folder):
                report.skipped_unreadable.append((shown, "ignored", "a .gitignore of the folder excludes it (the "
                                                                    "source's gitignore option can be turned off)"))
            elif is_folder:
                pending.append((relative, rules))
            else:
                try:  # follows a link: one that loops (ELOOP) is named in the report, never fatal
                    if entry.is_file():
                        found.append((relative, entry.stat()))
                    elif entry.is_symlink() and not os.path.exists(entry.path):
                        report.skipped_unreadable.append((relative, "unreadable", "a link that leads nowhere"))
                except FileNotFoundError:  # gone since the listing
                    continue
                except OSError as error:
                    report.skipped_unreadable.append((relative, "unreadable", error.strerror or type(error).__name__))
    return sorted(found, key=lambda item: item[0].split("/"))


@dataclass(frozen=True)
class _Rules:
    """One .gitignore's patterns and the folder (in the indexed one) whose paths they match: files by git's rules
    (a file in an excluded folder stays excluded), folders by the last pattern that matches ("*" then "!*/" keeps
    every folder open, as in git)."""

    base: str
    files: object  # pathspec.GitIgnoreSpec
    folders: object  # pathspec.PathSpec


def _gitignore_rules(entry: os.DirEntry, listed: str, report: IngestReport) -> list[_Rules]:
    """The rules of one .gitignore (read inside the folder only, up to _GITIGNORE_BYTES); lines that are no
    pattern are left out, as git leaves them."""
    import pathspec

    where = f"{listed}/.gitignore" if listed else ".gitignore"
    try:
        if not entry.is_file(follow_symlinks=False):
            return []
        with open(entry.path, "rb") as handle:
            raw = handle.read(_GITIGNORE_BYTES + 1)
    except OSError as error:
        report.skipped_unreadable.append((where, "unreadable", error.strerror or type(error).__name__))
        return []
    if len(raw) > _GITIGNORE_BYTES:
        report.skipped_unreadable.append((where, "too large", f"over {_GITIGNORE_BYTES // 1024} KiB: its patterns "
                                                              "are not applied"))
        return []
    lines = raw.decode("utf-8-sig", errors="replace").splitlines()
    try:
        files = pathspec.GitIgnoreSpec.from_lines(lines)
    except Exception:  # noqa: BLE001 - pathspec refuses lines git ignores ("!", "[z-a]"): each checked alone
        lines = [line for line in lines if _a_pattern(pathspec, line)]
        files = pathspec.GitIgnoreSpec.from_lines(lines)
    return [_Rules(listed, files, pathspec.PathSpec.from_lines("gitignore", lines))]


def _a_pattern(pathspec, line: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
        return True
    except Exception:  # noqa: BLE001 - see _gitignore_rules
        return False


def _ignored(rules: tuple[_Rules, ...], relative: str, is_folder: bool) -> bool:
    """As git decides: the deepest .gitignore with a pattern that matches the path (a folder's with its "/")
    says whether it is excluded ("!" patterns re-include)."""
    for rule in reversed(rules):
        path = relative[len(rule.base) + 1:] if rule.base else relative
        spec = rule.folders if is_folder else rule.files
        decided = spec.check_file(f"{path}/" if is_folder else path).include
        if decided is not None:
            return decided
    return False


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


# Files read by their content (no known suffix) that hold keys or credentials, by name: SSH and TLS keys,
# keystores, password databases, Terraform state and variables, "secrets", "credentials", "passwords", env files;
# and by content: a PEM private key.
_SECRET_NAME = re.compile(r"^id_(rsa|dsa|ecdsa|ed25519)$|\.(pem|key|p12|pfx|jks|keystore|kdbx|tfstate|tfvars)$"
                          r"|(^|[._-])(secrets?|credentials?|passwords?|env)([._-]|$)", re.IGNORECASE)
_PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")


def _binary(head: bytes) -> bool:
    """NUL bytes in a file's first 8 KiB, without a BOM that makes them text (UTF-16, UTF-32)."""
    return b"\x00" in head and not any(head.startswith(bom) for bom, _ in BOMS) and \
        not head.startswith((b"%PDF-", b"PK\x03\x04"))
