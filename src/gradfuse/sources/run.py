"""A TREC run file as a source: a precomputed ranking (for example from an engine gradfuse cannot run here).

A run only knows the queries it was made for, so this source answers a query whose text matches one of them
(case and whitespace ignored) and reports any other query as a failure instead of returning nothing.
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from gradfuse.access import Readers, may_read
from gradfuse.candidate import Candidate
from gradfuse.sources.base import QueryNotAnswered, SourceStats, read_manifest, stats_from_manifest
from gradfuse.sources.docstore import DocStore
from gradfuse.ingest.documents import IngestError, IngestReport, read_jsonl


MAX_RANK = 2**31 - 1  # SQLite's integers overflow far above; no run ranks that deep


def normalise_query(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def trec_id(identifier: str) -> str:
    """An id as one field of a TREC file: whitespace splits fields (HotpotQA's "Mākaha, Hawaii" became two), so
    an id holding whitespace or "%" is percent-encoded (UTF-8); `read_trec_run` decodes it back exactly."""
    return quote(identifier, safe="") if _NEEDS_ENCODING.search(identifier) else identifier


def read_trec_run(path: Path) -> Iterator[tuple[str, str, int, float]]:
    """(query id, doc id, rank, score) per line of `qid Q0 docid rank score tag`."""
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 6:
                raise IngestError(f"{path}:{line_number}: expected 'qid Q0 docid rank score tag', got {len(fields)} fields")
            try:
                rank, score = int(fields[3]), float(fields[4])
            except ValueError as error:
                raise IngestError(f"{path}:{line_number}: bad rank or score ({error})") from error
            if not 0 <= rank <= MAX_RANK or not math.isfinite(score):
                # A NaN score built and then failed every query; inf went out as "Infinity", which is not JSON.
                raise IngestError(f"{path}:{line_number}: the rank must be 0 to {MAX_RANK} and the score a finite "
                                  "number")
            yield _decoded(fields[0]), _decoded(fields[2]), rank, score


_NEEDS_ENCODING = re.compile(r"[\s%]")


def _decoded(field: str) -> str:
    """A field as `trec_id` wrote it, decoded; a "%" that is no UTF-8 percent-encoding stays as it is."""
    try:
        return unquote(field, errors="strict") if "%" in field else field
    except UnicodeDecodeError:
        return field


def run_rows(run_path: Path, depth: int | None = None) -> list[tuple[str, str, int, float]]:
    """The run's rows; with `depth`, each query's first `depth` in the order a search reads them (score, then the
    file's rank, then doc id): a run cut at the depth a benchmark asks for, which ranks as the whole run there."""
    rows = list(read_trec_run(run_path))
    if depth is None:
        return rows
    by_query: dict[str, list] = {}
    for row in rows:
        by_query.setdefault(row[0], []).append(row)
    return [row for ranked in by_query.values() for row in sorted(ranked, key=lambda r: (-r[3], r[2], r[1]))[:depth]]


def write_run_tables(version: Path, run_path: Path, queries_path: Path, report: IngestReport,
                     depth: int | None = None) -> dict[str, int]:
    """Store the run (cut at `depth`, if given) and its query texts beside the documents (written by the caller
    into docs.sqlite)."""
    queries = {q.doc_id: q.text for q in read_jsonl(queries_path, report)}
    rows = run_rows(run_path, depth)
    db = sqlite3.connect(version / "docs.sqlite")
    try:
        db.execute("CREATE TABLE run (qid TEXT, doc_id TEXT, score REAL, rank INTEGER, PRIMARY KEY (qid, doc_id))")
        db.execute("CREATE TABLE queries (qid TEXT PRIMARY KEY, normalised TEXT)")
        db.execute("CREATE INDEX queries_by_text ON queries (normalised)")
        db.executemany("INSERT OR REPLACE INTO run VALUES (?, ?, ?, ?)", [(q, d, s, r) for q, d, r, s in rows])
        db.executemany(
            "INSERT INTO queries VALUES (?, ?)",
            [(qid, normalise_query(text)) for qid, text in queries.items()],
        )
        db.commit()
    finally:
        db.close()
    return {"run_rows": len(rows), "run_queries": len({q for q, *_ in rows}), "query_texts": len(queries)}


def run_doc_ids(run_path: Path, depth: int | None = None) -> set[str]:
    return {doc_id for _, doc_id, _, _ in run_rows(run_path, depth)}


class RunSource:
    def __init__(self, name: str, version: Path):
        self.name, self._version = name, version
        self._manifest = read_manifest(version)
        self._docs = DocStore(version / "docs.sqlite")
        self._db = sqlite3.connect(f"file:{version / 'docs.sqlite'}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._docs.close()

    def warm(self) -> None:
        """Nothing to load: a run's rankings are stored."""

    def document(self, doc_id: str, *, readers: Readers = None) -> Candidate | None:
        return self._docs.document(self.name, doc_id, readers)

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        with self._lock:
            match = self._db.execute(
                "SELECT qid FROM queries WHERE normalised = ?", (normalise_query(query),)
            ).fetchone()
            if match is None:
                raise QueryNotAnswered(f"run source {self.name!r} has no ranking for this query (it answers only the "
                                  f"{self._manifest['run_queries']} queries its run file was made for)")
            # Equal scores keep the file's rank order, as trec_eval reads a run: rounded scores tie by thousands,
            # and any other order moves a published run's figures.
            ranked = self._db.execute(
                "SELECT doc_id, score FROM run WHERE qid = ? ORDER BY score DESC, rank, doc_id LIMIT ?", (match[0], k)
            ).fetchall()
        rows = self._docs.rows_for_ids([doc_id for doc_id, _ in ranked])
        kept = [(rows[doc_id], score) for doc_id, score in ranked if doc_id in rows]
        found = self._docs.candidates(self.name, [r for r, _ in kept], [s for _, s in kept])
        # A run is ranked already: the passages a caller may not read leave it, and the rest keep their order.
        readable = [c for c in found if may_read(c.readers, readers)]
        for rank, candidate in enumerate(readable, start=1):
            candidate.native_rank = rank
        return readable

    def stats(self) -> SourceStats:
        return stats_from_manifest(self.name, self._version, self._manifest, "precomputed run")
