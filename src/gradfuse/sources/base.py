"""What every source is: a name, `search(query, k)`, and stats; plus the on-disk versioning they share."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from gradfuse.access import InvalidReader, Readers, reader_rules
from gradfuse.candidate import Candidate
from gradfuse.checked import check_source_name
from gradfuse.embedding.encoder_names import recorded_encoder
from gradfuse.ingest.parts import parse_part
from gradfuse.ingest.readers import LIMIT_OPTIONS

SourceKind = Literal["beir", "jsonl", "files", "run"]
SOURCE_KINDS: tuple[str, ...] = ("beir", "jsonl", "files", "run")
_CHUNKING = ("chunk_words", "chunk_overlap")
_RECORDS = ("skip_malformed", "readers_field", "id_prefix", "part", *_CHUNKING)
# What a source of each kind reads of its spec's options (indexing/build.py): any other is a typo, refused rather
# than ignored (a misspelt `readers` would leave every file open to every reader).
BUILD_OPTIONS: dict[str, tuple[str, ...]] = {
    "beir": _RECORDS, "jsonl": (*_RECORDS, "id_field", "text_field", "title_field"),
    "files": (*_CHUNKING, "links_outside", "hidden", "gitignore", "readers", *LIMIT_OPTIONS),
    "run": ("corpus", "queries", "depth", "skip_malformed", "readers_field"),
}
FORMAT_VERSION = 3  # bump when the on-disk layout changes, so old builds are rebuilt rather than misread


class SourceError(RuntimeError):
    """A source cannot answer (missing index, unknown query for a run source, ...)."""


class QueryNotAnswered(SourceError):
    """A healthy source that cannot answer this query (a run source asked a query its run was not made for): the
    query's failure, not the source's (its breaker does not count it)."""


class CallerRefused(QueryNotAnswered):
    """What one caller sent was refused (a remote's 4xx to its request, a question longer than the remote takes):
    it says nothing of the source's health either way, so its breaker neither counts it nor is reset by it."""


class UnknownSource(SourceError):
    """A request named a source that is not built (or is disabled) in this workspace. `public`: the message
    without the names given (see `fusion.UnknownMethod`)."""

    def __init__(self, message: str, public: str | None = None):
        super().__init__(message)
        self.public = public or "sources: no source of that name is built in this workspace"


@dataclass(frozen=True)
class SourceSpec:
    """How to build one source: its kind, its input, and reader options."""

    name: str
    kind: SourceKind
    path: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"source {self.name!r}: unknown kind {self.kind!r} (choose from {', '.join(SOURCE_KINDS)})")
        check_source_name(self.name)
        unknown = sorted(set(self.options) - set(BUILD_OPTIONS[self.kind]))
        if unknown:
            raise ValueError(f"source {self.name!r}: {', '.join(map(repr, unknown))} is no option of kind "
                             f"{self.kind!r} (its options: {', '.join(BUILD_OPTIONS[self.kind])})")
        for flag in ("links_outside", "hidden", "gitignore", "skip_malformed"):  # "false" would read as true
            if flag in self.options and not isinstance(self.options[flag], bool):
                raise ValueError(f"source {self.name!r}: {flag} is true or false, not {self.options[flag]!r}")
        depth = self.options.get("depth")
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise ValueError(f"source {self.name!r}: depth is how many of each query's ranked documents the run "
                             f"keeps, a whole number from 1, not {depth!r}")
        if "part" in self.options:
            try:
                parse_part(self.options["part"])
            except ValueError as error:
                raise ValueError(f"source {self.name!r}: {error}") from None
        if self.kind == "files" and "readers" in self.options:  # refused when the config is read, not at build
            try:
                reader_rules(self.options["readers"])
            except InvalidReader as error:
                raise ValueError(f"source {self.name!r}: {error}") from None


@dataclass
class SourceStats:
    name: str
    kind: str
    documents: int
    index_bytes: int | None  # None: held by another engine, which does not say
    encoder: str | None
    built_at: str
    input: str
    retrieval: str


# Extra candidates fetched before the cut, so that equal scores at the cut are settled by doc id, not by how a
# store happens to lay rows out: the same data then ranks the same in every store (embedded, PostgreSQL).
TIE_SLACK = 16


def rank_by_score(candidates: list[Candidate], k: int) -> list[Candidate]:
    """Best native score first, equal scores by doc id; cut to k and ranked 1..k."""
    ranked = sorted(candidates, key=lambda c: (-c.native_score, c.doc_id))[:k]
    for rank, candidate in enumerate(ranked, start=1):
        candidate.native_rank = rank
    return ranked


@runtime_checkable
class Source(Protocol):
    name: str

    def warm(self) -> None:
        """Load what a search needs (its query encoder) before the sources' timeouts start: a cold load counted
        against every source's timeout, and a cold search on a loaded machine failed with "every source failed"."""

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        """The k best passages for `query` among those `readers` may read (gradfuse.access; None: every passage),
        filtered before they are ranked, inside the store, so that k come back where k are readable."""

    def stats(self) -> SourceStats: ...


# --- versioned folders: a build writes a new version and then swaps a pointer, so a crash mid-build leaves
# the previous version intact and in use.

def current_version(source_dir: Path) -> Path | None:
    """The published version folder, or None. A pointer read just before a publish names a folder that the
    publish then deletes: the pointer is read again, so a request racing a publish gets the new version instead
    of "no source named ..." (3 requests in 21,000 did)."""
    pointer = source_dir / "CURRENT"
    for _ in range(5):
        try:
            version = source_dir / pointer.read_text().strip()
        except FileNotFoundError:
            return None
        if version.is_dir():
            return version
    return None


def publish_version(source_dir: Path, version: Path) -> None:
    """Make `version` current: its files and then the pointer reach the disk before the old version goes, so a
    power loss leaves one whole version published."""
    previous = current_version(source_dir)
    _sync_tree(version)
    pointer_tmp = source_dir / "CURRENT.tmp"
    with open(pointer_tmp, "w") as handle:
        handle.write(version.name)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(pointer_tmp, source_dir / "CURRENT")  # atomic on POSIX
    _sync_folder(source_dir)
    announce_change(source_dir.parent)
    for stale in source_dir.iterdir():
        if stale.is_dir() and stale != version and (stale == previous or stale.name.startswith("build-")):
            shutil.rmtree(stale, ignore_errors=True)


def announce_change(sources: Path) -> None:
    """Mark the folder of all sources changed (its modification time): a process that holds hundreds of sources
    lists them and checks their versions again only when it moved (federation/catalog.py)."""
    os.utime(sources)


def listing_stamp(sources: Path) -> int | None:
    """What `announce_change` moves, or None where no source folder exists yet."""
    try:
        return os.stat(sources).st_mtime_ns
    except FileNotFoundError:
        return None


def _sync_tree(folder: Path) -> None:
    """Every file under `folder` on disk (and private: 0600 files, 0700 folders), then the folders."""
    for path in sorted(folder.rglob("*"), reverse=True):  # files before the folders that hold them
        if path.is_file():
            os.chmod(path, 0o600)
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            os.chmod(path, 0o700)
            _sync_folder(path)
    os.chmod(folder, 0o700)
    _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_manifest(version: Path) -> dict[str, Any]:
    return json.loads((version / "manifest.json").read_text())


def write_manifest(version: Path, manifest: dict[str, Any]) -> None:
    (version / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def stats_from_manifest(name: str, version: Path, manifest: dict[str, Any], retrieval: str) -> SourceStats:
    return SourceStats(
        name=name,
        kind=manifest["kind"],
        documents=manifest["documents"],
        index_bytes=folder_bytes(version),
        encoder=recorded_encoder(manifest["encoder"]) if manifest.get("encoder") else None,
        built_at=manifest["built_at"],
        input=manifest["input"],
        retrieval=retrieval,
    )


def stats_dict(stats: SourceStats) -> dict[str, Any]:
    return asdict(stats)
