"""Sources: the source kinds, each answering `search(query, k)` with candidates, one kind per file: built ones
(embedded.py over docstore.py, run.py), PostgreSQL (postgres.py, local_postgres.py), engines' collections and
other gradfuse servers (engines.py), a framework's retriever (retriever.py); base.py: the Source protocol, SourceSpec,
the errors and a built source's version folders; summary.py: a source's routing summary.

It imports ingest/ and embedding/, never indexing/, federation/ or a later step; `open_source` is the factory of
built sources by name.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gradfuse.sources.base import (
    Source,
    SourceError,
    SourceSpec,
    SourceStats,
    UnknownSource,
    current_version,
    read_manifest,
)
from gradfuse.checked import check_source_name
from gradfuse.ingest.documents import IngestError
from gradfuse.sources.embedded import EmbeddedSource
from gradfuse.sources.postgres import registered
from gradfuse.sources.run import RunSource

__all__ = [
    "IngestError",
    "Source",
    "SourceError",
    "SourceSpec",
    "SourceStats",
    "UnknownSource",
    "check_source_name",
    "misnamed_source_folders",
    "open_source",
    "built_source_names",
]


def built_source_names(workspace: Path) -> list[str]:
    """Sources built in the workspace folder, and database tables loaded with `--into` (registered there). A
    folder whose name is no valid source name is left out (see `misnamed_source_folders`): one such folder broke
    every default search."""
    return [name for name in _source_folders(workspace) if _valid_name(name)]


def misnamed_source_folders(workspace: Path) -> list[str]:
    """Folders under sources/ that hold an index but have no valid source name (made by hand or another tool)."""
    return [name for name in _source_folders(workspace) if not _valid_name(name)]


def _source_folders(workspace: Path) -> list[str]:
    root = workspace / "sources"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (current_version(p) or registered(p) is not None))


def _valid_name(name: str) -> bool:
    try:
        check_source_name(name)
    except ValueError:
        return False
    return True


def open_source(workspace: Path, name: str, *, mode: str = "hybrid", version: Path | None = None) -> Source:
    """The one factory: a built source by name, whatever its kind (`version`: that version folder, not the
    current one)."""
    version = version or current_version(workspace / "sources" / name)
    if version is None:
        known = ", ".join(built_source_names(workspace)) or "none"
        raise UnknownSource(f"no built source named {name!r} in {workspace} (built: {known})")
    try:
        if read_manifest(version)["kind"] == "run":
            return RunSource(name, version)
        return EmbeddedSource(name, version, mode=mode)
    except (OSError, ValueError, sqlite3.Error) as error:
        # The server's problem, not the request's: tantivy, for one, cannot open an index on a read-only file
        # system (it writes a lock file), which the service answered with 422 while /healthz said ok.
        raise SourceError(f"source {name!r}: its index in {version} cannot be opened ({type(error).__name__}: "
                          f"{error}); a read-only workspace cannot be served") from None
