"""A source that lives in PostgreSQL: full-text search (tsvector + GIN, ranked by ts_rank_cd) and pgvector
(HNSW or exact), with the same retrieval modes as the embedded store, so a benchmark can swap one for the other.

The table (created by `gradfuse index ... --into postgres://...`, or a team's own with the columns named in the
config) holds one row per passage: id, title, text, chunk provenance, who may read it (`readers`, a text[] of
principals and groups; NULL or empty: whoever may read the source), a content hash (what makes reloading
idempotent), a generated `tsv` column and the encoder's `embedding`. A metadata table `gradfuse_sources` records
which encoder, dimension, language and distance each table was built with.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gradfuse.access import Readers
from gradfuse.candidate import Candidate, Location
from gradfuse.redact import driver_message, has_url_password, redact
from gradfuse.sources.base import TIE_SLACK, SourceError, SourceStats, announce_change, rank_by_score
from gradfuse.sources.embedded import RETRIEVAL_MODES, hybrid_depth, rrf_in_source
from gradfuse.embedding.encoder_names import recorded_encoder

DISTANCES = {"ip": ("<#>", "vector_ip_ops"), "cosine": ("<=>", "vector_cosine_ops")}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOKEN = re.compile(r"\w+", flags=re.UNICODE)
LOADED_READERS_COLUMN = "readers"  # the column `gradfuse index --into` fills with each document's readers
# A readers column's type (information_schema's udt_name) and the array type its filter binds the readers as:
# `&&` needs both sides of one type (varchar[] && text[] has no operator).
READERS_TYPES = {"_text": "text[]", "_varchar": "varchar[]"}


class PostgresError(SourceError):
    """A postgres source cannot be reached or used; the message says which part (URL, table, extension)."""


@dataclass(frozen=True)
class PostgresSettings:
    """How to reach and read one table. Either `url` (no password in it: use ~/.pgpass or PGPASSWORD) or
    `url_env`, the name of an environment variable that holds the URL."""

    table: str
    url: str | None = None
    url_env: str | None = None
    id_column: str = "doc_id"
    text_column: str = "text"
    title_column: str = "title"
    tsv_column: str = "tsv"  # "" to compute to_tsvector on the fly (a table without one; slow without an index)
    embedding_column: str = "embedding"
    language: str = "english"  # the text search configuration
    distance: str = "ip"  # ip (MiniLM vectors are normalised) | cosine
    ef_search: int = 64  # HNSW candidates per query (raised to the depth asked): higher is slower, closer to exact
    exact: bool = False  # exact nearest neighbours (a sequential scan) instead of the HNSW index
    pool_size: int = 4
    # The text[] column of who may read a row (principals' names and groups; docs/access.md): a search for a caller
    # is filtered on it inside the database. NULL or empty: every reader of the source. "": no document permissions.
    readers_column: str = ""

    def __post_init__(self):
        for name in ("table", "id_column", "text_column", "title_column", "embedding_column"):
            if not _IDENTIFIER.match(getattr(self, name)):
                raise ValueError(f"postgres {name} {getattr(self, name)!r} must be a plain SQL identifier")
        for name in ("tsv_column", "readers_column"):  # may be "" (none)
            if getattr(self, name) and not _IDENTIFIER.match(getattr(self, name)):
                raise ValueError(f"postgres {name} {getattr(self, name)!r} must be a plain SQL identifier")
        if self.distance not in DISTANCES:
            raise ValueError(f"postgres distance {self.distance!r}: choose from {', '.join(DISTANCES)}")
        if not _IDENTIFIER.match(self.language):
            raise ValueError(f"postgres language {self.language!r} must be a text search configuration name")
        if self.url and password_in(self.url):
            raise ValueError("a postgres url must not carry a password (it would end up in a file): use url_env, "
                             "PGPASSWORD or ~/.pgpass")

    def conninfo(self) -> str:
        if self.url_env:
            value = os.environ.get(self.url_env)
            if not value:
                raise PostgresError(f"environment variable {self.url_env} (the postgres URL) is not set")
            return value
        if not self.url:
            raise PostgresError("a postgres source needs url or url_env")
        return self.url


def default_table(source: str) -> str:
    """A source's table when none is named: its name as an SQL identifier."""
    return source.replace("-", "_")


def password_in(url: str) -> bool:
    """Parsable or not (a URL psycopg rejects is still refused if it carries a password)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        return "password" in conninfo_to_dict(url)
    except Exception:
        return has_url_password(url)


def safe_url(url: str) -> str:
    """The URL without its password, for messages and files; one psycopg cannot parse is redacted as text."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        parts = conninfo_to_dict(url)
    except Exception:
        return redact(url)
    parts.pop("password", None)
    return make_conninfo(**parts)


class PostgresTable:
    """One pooled connection set per table, shared by every retrieval mode of the source."""

    def __init__(self, name: str, settings: PostgresSettings, *, timeout_s: float):
        from psycopg_pool import ConnectionPool

        self.name, self.settings, self.timeout_s = name, settings, timeout_s
        url = settings.conninfo()
        self.where = f"{safe_url(url)} table {settings.table}"
        _probe(url, name)  # a wrong URL fails here, by name, instead of as a pool timeout later
        self.pool = ConnectionPool(url, min_size=1, max_size=settings.pool_size, open=True, timeout=timeout_s,
                                   kwargs={"connect_timeout": max(1, int(timeout_s))},
                                   check=ConnectionPool.check_connection, name=f"gradfuse-{name}")
        # readers_column as read: also the `readers` column of a table gradfuse loaded where the config names none
        self.columns, self.metadata, self.readers_type, self.readers_column = self._inspect()

    def _inspect(self) -> tuple[set[str], dict[str, Any], str | None, str]:
        s = self.settings
        with self.pool.connection() as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (s.table,)).fetchone()[0]
            if exists is None:
                database = conn.info.dbname
                raise PostgresError(f"postgres source {self.name!r}: table {s.table!r} does not exist in database "
                                    f"{database!r}; load it with `gradfuse index ... --into URL --source "
                                    f"{self.name}`")
            types = dict(conn.execute(
                "SELECT column_name, udt_name FROM information_schema.columns WHERE table_name = %s AND "
                "table_schema = ANY(current_schemas(false))", (s.table,)).fetchall())
            columns = set(types)
            missing = [c for c in (s.id_column, s.text_column, s.readers_column) if c and c not in columns]
            if missing:
                raise PostgresError(f"postgres source {self.name!r}: table {s.table!r} has no column "
                                    f"{', '.join(missing)} (columns: {', '.join(sorted(columns))})")
            readers_type = READERS_TYPES.get(types[s.readers_column]) if s.readers_column else None
            if s.readers_column and readers_type is None:
                udt = types[s.readers_column]
                shown = f"{udt[1:]}[]" if udt.startswith("_") else udt
                raise PostgresError(f"postgres source {self.name!r}: readers_column {s.readers_column!r} of table "
                                    f"{s.table!r} is {shown}, not text[] or varchar[] (the names of the "
                                    "principals and groups who may read the row)")
            metadata = {}
            if conn.execute("SELECT to_regclass('gradfuse_sources')").fetchone()[0] is not None:
                row = conn.execute("SELECT encoder, dimension, language, distance, input, built_at FROM "
                                   "gradfuse_sources WHERE table_name = %s", (s.table,)).fetchone()
                if row:
                    metadata = dict(zip(("encoder", "dimension", "language", "distance", "input", "built_at"), row))
        if metadata and not s.readers_column and types.get(LOADED_READERS_COLUMN) == "_text":
            # a table gradfuse loaded, named in a config without readers_column: its readers are still read, or
            # the documents it loaded for some would be open to all
            return columns, metadata, READERS_TYPES["_text"], LOADED_READERS_COLUMN
        return columns, metadata, readers_type, s.readers_column

    def vector_version(self) -> tuple[int, ...] | None:
        """The installed pgvector's version (0.8.0 -> (0, 8, 0)), or None where it is not installed."""
        with self.pool.connection() as conn:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        return None if row is None else tuple(int(part) for part in re.findall(r"\d+", row[0]))

    def close(self) -> None:
        self.pool.close()


def _probe(url: str, name: str) -> None:
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as error:
        raise PostgresError(f"postgres source {name!r}: cannot connect to {safe_url(url)}: "
                            f"{driver_message(error)}") from error


class PostgresSource:
    """`search(query, k)` over a PostgreSQL table, by `bm25` (full-text search; the name is the embedded store's,
    the ranking is ts_rank_cd), `dense` (pgvector) or `hybrid` (RRF of both inside the source)."""

    def __init__(self, table: PostgresTable, *, mode: str = "hybrid", encoder: str):
        if mode not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval mode {mode!r} is not one of {', '.join(RETRIEVAL_MODES)}")
        self.name, self.mode, self._table, self._encoder = table.name, mode, table, encoder
        self._iterative_scan = False  # pgvector 0.8's hnsw.iterative_scan, for filtered HNSW searches
        if mode != "bm25":
            self._check_dense()

    def _check_dense(self) -> None:
        table, s = self._table, self._table.settings
        version = table.vector_version()
        self._iterative_scan = version is not None and version >= (0, 8)
        if version is None:
            raise PostgresError(f"postgres source {self.name!r}: the pgvector extension is not installed in "
                                f"{table.where.split(' table ')[0]} (CREATE EXTENSION vector) — dense and hybrid "
                                "retrieval need it; bm25 does not")
        if s.embedding_column not in table.columns:
            raise PostgresError(f"postgres source {self.name!r}: table {s.table!r} has no {s.embedding_column!r} "
                                "column for dense retrieval")
        built_with = table.metadata.get("encoder")
        # Queries are embedded in float32 whatever the passages' precision: the model must match, not the precision.
        if built_with and built_with.partition("@")[0] != self._encoder.partition("@")[0]:
            raise PostgresError(f"postgres source {self.name!r}: its vectors come from {built_with!r}, the "
                                f"workspace encoder is {self._encoder!r}")

    def warm(self) -> None:
        if self.mode != "bm25":
            from gradfuse.embedding.encoder import load_encoder

            load_encoder(self._encoder)

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        deeper = k + TIE_SLACK
        if self.mode == "bm25":
            rows = self._lexical(query, deeper, readers)
        elif self.mode == "dense":
            rows = self._dense(query, deeper, readers)
        else:
            rows = self._hybrid(query, deeper, readers)
        return rank_by_score([self._candidate(row, rank) for rank, row in enumerate(rows, start=1)], k)

    def document(self, doc_id: str, *, readers: Readers = None) -> Candidate | None:
        """One passage by its id (a cited passage opened again), or None: also where `readers` may not read it."""
        s = self._table.settings
        readable, params = self._readers_filter(readers)
        rows = self._run(f"SELECT {self._select_list()}, 0.0 FROM {s.table} WHERE {s.id_column}::text = %(id)s"
                         f"{' AND ' + readable if readable else ''} LIMIT 1", {"id": doc_id, **params}, [])
        return self._candidate(rows[0], 1) if rows else None

    def _readers_filter(self, readers: Readers) -> tuple[str, dict]:
        """The condition that keeps the rows `readers` may read, and its parameter; ("", {}) where every row is
        readable (readers None, or a table without a readers column), so that no clause costs anything then."""
        column, array_type = self._table.readers_column, self._table.readers_type
        if readers is None or not column:
            return "", {}
        # Bound, never formatted: the names reach the server as a parameter.
        return (f"({column} IS NULL OR cardinality({column}) = 0 OR {column} && %(readers)s::{array_type})",
                {"readers": sorted(readers)})

    def _select_list(self) -> str:
        s, columns = self._table.settings, self._table.columns
        title = s.title_column if s.title_column in columns else "''"
        provenance = ("parent_id, span_start, span_end" if {"parent_id", "span_start", "span_end"} <= columns
                      else "NULL, NULL, NULL") + (", location" if "location" in columns else ", NULL")
        readers = f"{self._table.readers_column}::text[]" if self._table.readers_column else "NULL"
        return f"{s.id_column}::text, coalesce({title}, ''), {s.text_column}, {provenance}, {readers}"

    def _tsvector(self) -> str:
        s, columns = self._table.settings, self._table.columns
        if s.tsv_column and s.tsv_column in columns:
            return s.tsv_column
        title = f"coalesce({s.title_column}, '') || ' ' || " if s.title_column in columns else ""
        return f"to_tsvector('{s.language}', {title}coalesce({s.text_column}, ''))"

    def _run(self, sql: str, params: dict, settings: list[str]) -> list[tuple]:
        with self._table.pool.connection() as conn, conn.transaction():
            conn.execute(f"SET LOCAL statement_timeout = {int(self._table.timeout_s * 1000)}")
            for statement in settings:
                conn.execute(statement)
            return conn.execute(sql, params).fetchall()

    def _lexical(self, query: str, k: int, readers: Readers = None) -> list[tuple]:
        # Any of the query's words (OR), like BM25: plainto_tsquery would demand all of them. Each word once:
        # ts_rank_cd's cost grows with the query's length, and a pasted argument repeats its words a lot.
        terms = list(dict.fromkeys(word.lower() for word in _TOKEN.findall(query)))
        if not terms:
            return []
        s = self._table.settings
        readable, params = self._readers_filter(readers)
        sql = (f"SELECT {self._select_list()}, ts_rank_cd({self._tsvector()}, q) AS score "
               f"FROM {s.table}, to_tsquery(%(language)s::regconfig, %(terms)s) AS q "
               f"WHERE {self._tsvector()} @@ q{' AND ' + readable if readable else ''} "
               f"ORDER BY score DESC, {s.id_column} LIMIT %(k)s")
        return self._run(sql, {"language": s.language, "terms": " | ".join(terms), "k": k, **params}, [])

    def _dense(self, query: str, k: int, readers: Readers = None) -> list[tuple]:
        from gradfuse.embedding.encoder import load_encoder

        s = self._table.settings
        operator, _ = DISTANCES[s.distance]
        vector = vector_literal(load_encoder(self._encoder).encode_query(query))
        # Score as a similarity, like the embedded store: inner product, or 1 - cosine distance.
        score = f"-({s.embedding_column} {operator} %(v)s::vector)" if s.distance == "ip" else \
            f"1 - ({s.embedding_column} {operator} %(v)s::vector)"
        readable, params = self._readers_filter(readers)
        sql = (f"SELECT {self._select_list()}, {score} AS score FROM {s.table} "
               f"{'WHERE ' + readable + ' ' if readable else ''}"
               f"ORDER BY {s.embedding_column} {operator} %(v)s::vector LIMIT %(k)s")
        # An HNSW scan returns at most ef_search rows: below k it would silently cut the list short.
        settings = (["SET LOCAL enable_indexscan = off"] if s.exact
                    else [f"SET LOCAL hnsw.ef_search = {max(int(s.ef_search), k)}"])
        if readable and not s.exact:
            # HNSW filters the ef_search rows it found, after the scan: where the caller may read few of them, fewer
            # than k come back. pgvector 0.8's iterative scan goes on through the graph until k rows pass the filter
            # (or hnsw.max_scan_tuples are visited); relaxed order is enough, rank_by_score sorts them again. An
            # older pgvector has none: an exact scan is slower but returns k.
            settings.append("SET LOCAL hnsw.iterative_scan = relaxed_order" if self._iterative_scan
                            else "SET LOCAL enable_indexscan = off")
        return self._run(sql, {"v": vector, "k": k, **params}, settings)

    def _hybrid(self, query: str, k: int, readers: Readers = None) -> list[tuple]:
        depth = hybrid_depth(k)
        rankings = [self._lexical(query, depth, readers), self._dense(query, depth, readers)]
        rows = {row[0]: row for ranking in rankings for row in ranking}  # by doc id; the score column is replaced
        best = rrf_in_source({name: [row[0] for row in ranking] for name, ranking in zip(("bm25", "dense"), rankings)},
                             k)
        return [(*rows[doc_id][:-1], score, ranks) for doc_id, score, ranks in best]

    def _candidate(self, row: tuple, rank: int) -> Candidate:
        """A row of the select list and its score; a hybrid row also has its ranks in the fused rankings."""
        doc_id, title, text, parent_id, start, end, location, readers, score, *ranks = row
        return Candidate(source=self.name, doc_id=doc_id, text=text, title=title, native_score=float(score),
                         native_rank=rank, parent_id=parent_id, span=(start, end) if start is not None else None,
                         location=Location.from_json(location), retrieval_ranks=ranks[0] if ranks else {},
                         readers=tuple(readers or ()))

    def sample_texts(self, limit: int) -> tuple[int, list[str]]:
        """The rows the table holds and the embedding texts of up to `limit` of them, drawn at random over the
        table."""
        import psycopg

        from gradfuse.embedding.encoder import embedding_text

        s = self._table.settings
        try:
            count = self._run(f"SELECT count(*) FROM {s.table}", {}, [])[0][0]
            # SYSTEM reads only the pages it draws (a large table is not scanned): about four times the rows wanted,
            # and at least 1,000, so that enough come back; random() picks among them.
            percent = min(100.0, 100.0 * max(4 * limit, 1000) / max(count, 1))
            rows = self._run(f"SELECT {self._select_list()} FROM {s.table} TABLESAMPLE SYSTEM (%(percent)s::real) "
                             "ORDER BY random() LIMIT %(limit)s", {"percent": percent, "limit": limit}, [])
        except psycopg.Error as error:  # the pool's timeout included
            raise PostgresError(f"postgres source {self.name!r}: {self._table.where} cannot be sampled: "
                                f"{driver_message(error)}") from error
        return count, [embedding_text(title, text) for _, title, text, *_ in rows]

    def change_marker(self) -> str:
        """What moves when the table changes: PostgreSQL's counts of the rows ever inserted, updated and deleted in
        it (its statistics, kept without a column of the table's; reset with them, which reads as a change)."""
        row = self._run("SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables "
                        "WHERE relid = %(table)s::regclass", {"table": self._table.settings.table}, [])
        return ":".join(map(str, row[0])) if row else ""

    def stats(self) -> SourceStats:
        s, metadata = self._table.settings, self._table.metadata
        with self._table.pool.connection() as conn:
            documents = conn.execute(f"SELECT count(*) FROM {s.table}").fetchone()[0]
            size = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (s.table,)).fetchone()[0]
        built = metadata.get("built_at")
        return SourceStats(name=self.name, kind="postgres", documents=documents, index_bytes=size,
                           encoder=recorded_encoder(metadata["encoder"]) if metadata.get("encoder") else None, built_at=built.isoformat(timespec="seconds")
                           if built else "-", input=self._table.where, retrieval=self.mode)


def vector_literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"


# --- a table loaded with `--into` is registered in the workspace, so it is a source like the built ones.

REGISTRATION = "postgres.json"


def register(source_dir: Path, settings: PostgresSettings) -> None:
    """Register a table `gradfuse index --into` has just loaded: the load added its readers column, if missing."""
    settings = replace(settings, readers_column=settings.readers_column or LOADED_READERS_COLUMN)
    source_dir.mkdir(parents=True, exist_ok=True)
    staging = source_dir / (REGISTRATION + ".tmp")
    staging.write_text(json.dumps(asdict(settings), indent=2, sort_keys=True))
    os.replace(staging, source_dir / REGISTRATION)
    announce_change(source_dir.parent)


def registered(source_dir: Path) -> PostgresSettings | None:
    path = source_dir / REGISTRATION
    return PostgresSettings(**json.loads(path.read_text())) if path.is_file() else None
