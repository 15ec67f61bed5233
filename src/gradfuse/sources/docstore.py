"""Document text and chunk provenance in SQLite, one file per source version."""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gradfuse.access import Readers, may_read
from gradfuse.candidate import Candidate, Location
from gradfuse.ingest.documents import Document

_SCHEMA = """
CREATE TABLE docs (
    row INTEGER PRIMARY KEY,   -- position in the embedding matrix and in the BM25 index
    doc_id TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    text TEXT NOT NULL,
    parent_id TEXT,
    span_start INTEGER,
    span_end INTEGER,
    location TEXT,             -- gradfuse.candidate.Location as JSON, for passages read from files
    readers TEXT               -- who may read it, a JSON list (gradfuse.access); NULL: every reader of the source
);
CREATE INDEX docs_by_file ON docs (parent_id);
CREATE TABLE files (           -- a folder source's files, as this version holds them (indexing/folder_sync.py)
    path TEXT PRIMARY KEY,
    digest TEXT NOT NULL,      -- sha256 of its bytes (folder_sync.UNREAD and its stat: skipped before they were read)
    readers TEXT NOT NULL,     -- the readers its path gave it (JSON), or "refused" (a hard link across readers)
    parse_entry TEXT,          -- the parse-cache entry it used
    report TEXT NOT NULL       -- what reading it added to the build's report (IngestReport as JSON)
)
"""


@dataclass(frozen=True)
class FileRecord:
    path: str
    digest: str
    readers: str
    parse_entry: str | None
    report: str


def write_documents(path: Path, documents: Iterable[Document], files: Iterable[FileRecord] = ()) -> int:
    db = sqlite3.connect(path)
    try:
        db.executescript(_SCHEMA)
        _insert(db, documents, 0)
        _put_files(db, files)
        db.commit()
        return db.execute("SELECT COUNT(*) FROM docs").fetchone()[0]
    finally:
        db.close()


def update_documents(path: Path, *, dropped_files: list[str], documents: list[Document], first_row: int,
                     files: list[FileRecord]) -> tuple[list[int], int, int]:
    """A copy of a version's document store changed in place: the passages of `dropped_files` deleted (their text
    overwritten, not left in free pages), `documents` added from row `first_row` on, and `files` recorded, those
    dropped and not recorded again forgotten. (The rows dropped, the passages now held, those that name their
    readers.)"""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA secure_delete = ON")
        dropped: list[int] = []
        for start in range(0, len(dropped_files), 900):  # SQLite caps the number of bound parameters
            batch = dropped_files[start : start + 900]
            marks = ",".join("?" * len(batch))
            dropped += [row for (row,) in db.execute(f"SELECT row FROM docs WHERE parent_id IN ({marks})", batch)]
            db.execute(f"DELETE FROM docs WHERE parent_id IN ({marks})", batch)
            db.execute(f"DELETE FROM files WHERE path IN ({marks})", batch)
        _insert(db, documents, first_row)
        _put_files(db, files)
        db.commit()
        return dropped, *db.execute("SELECT COUNT(*), COUNT(readers) FROM docs").fetchone()
    finally:
        db.close()


def read_files_table(path: Path) -> dict[str, FileRecord]:
    """The files a version holds (none for a store without them: not a folder, or built before syncs)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT path, digest, readers, parse_entry, report FROM files").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()
    return {row[0]: FileRecord(*row) for row in rows}


def _insert(db: sqlite3.Connection, documents: Iterable[Document], first_row: int) -> None:
    rows = (
        (row, d.doc_id, d.title, d.text, d.parent_id, *(d.span or (None, None)),
         d.location.to_json() if d.location else None, json.dumps(d.readers) if d.readers else None)
        for row, d in enumerate(documents, start=first_row)
    )
    try:
        db.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    except sqlite3.IntegrityError as error:
        raise ValueError(f"duplicate document id in input: {error}") from error


def stored_documents(path: Path) -> Iterator[tuple[int, Document]]:
    """(row, passage) of every passage a version's store holds, in row order: what its BM25 index is made of."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for row, doc_id, title, text, parent_id, readers in db.execute(
                "SELECT row, doc_id, title, text, parent_id, readers FROM docs ORDER BY row"):
            yield row, Document(doc_id, text, title, parent_id=parent_id,
                                readers=_readers(readers) if readers else ())
    finally:
        db.close()


def _put_files(db: sqlite3.Connection, files: Iterable[FileRecord]) -> None:
    db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)",
                   ((f.path, f.digest, f.readers, f.parse_entry, f.report) for f in files))


class DocStore:
    """Read side, shared by the threads that query sources concurrently."""

    def __init__(self, path: Path):
        self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(docs)")}
        self._location = "location" if "location" in columns else "NULL"  # built before locations were kept
        self._readers = "readers" if "readers" in columns else "NULL"  # built before documents named readers

    def candidates(self, source: str, rows: list[int], scores: list[float]) -> list[Candidate]:
        """Candidates for `rows` in the given order, ranked 1..n with their native scores."""
        if not rows:
            return []
        with self._lock:
            fetched = {
                r[0]: r
                for r in self._db.execute(
                    f"SELECT row, doc_id, title, text, parent_id, span_start, span_end, {self._location}, "
                    f"{self._readers} FROM docs "
                    f"WHERE row IN ({','.join('?' * len(rows))})",
                    rows,
                )
            }
        result = []
        for rank, (row, score) in enumerate(zip(rows, scores), start=1):
            _, doc_id, title, text, parent_id, start, end, location, readers = fetched[row]
            result.append(
                Candidate(
                    source=source,
                    doc_id=doc_id,
                    text=text,
                    title=title,
                    native_score=float(score),
                    native_rank=rank,
                    parent_id=parent_id,
                    span=(start, end) if start is not None else None,
                    location=Location.from_json(location),
                    readers=_readers(readers) if readers else (),
                )
            )
        return result

    def texts(self, rows: list[int]) -> dict[int, tuple[str, str]]:
        """(title, text) of each of `rows`."""
        with self._lock:
            return {row: (title, text) for row, title, text in self._db.execute(
                f"SELECT row, title, text FROM docs WHERE row IN ({','.join('?' * len(rows))})", rows)}

    def document(self, source: str, doc_id: str, readers: Readers) -> Candidate | None:
        """One passage by its id (a cited passage opened again), or None: also where `readers` may not read it,
        so that a caller cannot tell a passage it may not read from one that does not exist."""
        row = self.rows_for_ids([doc_id]).get(doc_id)
        found = None if row is None else self.candidates(source, [row], [0.0])[0]
        return found if found is not None and may_read(found.readers, readers) else None

    def rows_for_ids(self, doc_ids: list[str]) -> dict[str, int]:
        with self._lock:
            return dict(
                self._db.execute(
                    f"SELECT doc_id, row FROM docs WHERE doc_id IN ({','.join('?' * len(doc_ids))})", doc_ids
                )
            ) if doc_ids else {}

    def restricted_rows(self) -> list[tuple[int, tuple[str, ...]]]:
        """(row, readers) of every document that names its readers."""
        if self._readers == "NULL":
            return []
        with self._lock:
            return [(row, _readers(readers)) for row, readers in
                    self._db.execute("SELECT row, readers FROM docs WHERE readers IS NOT NULL")]

    def close(self) -> None:
        with self._lock:
            self._db.close()


@functools.lru_cache(maxsize=4096)
def _readers(stored: str) -> tuple[str, ...]:
    """A row's readers as stored (JSON): few distinct lists serve many rows, so each is parsed once."""
    return tuple(json.loads(stored))
