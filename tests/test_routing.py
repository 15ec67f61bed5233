"""Routing before retrieval: summaries made at build (and sent by another gradfuse), only the routed sources asked,
what was skipped and why, a stage 1 that reads only the pairs it needs, and a bounded set of open sources."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import ASTRONOMY, COOKING, write_jsonl
from live_server import gradfuse_serve

from gradfuse import SourceSpec, Workspace
from gradfuse.cli import app
from gradfuse.config import Config, load_config
from gradfuse.schemas import search_record
from gradfuse.selection import SelectionSettings, choose_sources, select_sources, source_redundancy
from gradfuse.selection.routing import RoutingSettings, route
from gradfuse.sources.summary import MAX_CLAIMED_DOCUMENTS, SUMMARY_FILE, SourceSummary, SummaryTable, summarize

TOPICS = {
    "astronomy": ASTRONOMY,
    "cooking": COOKING[:2],
    "sailing": [
        {"id": "knots", "text": "A bowline knot makes a fixed loop at the end of a mooring line on a sailboat."},
        {"id": "tack", "text": "To tack, the sailor turns the bow of the boat through the wind."},
    ],
    "gardening": [
        {"id": "compost", "text": "Compost made from kitchen scraps and leaves feeds the soil of a vegetable garden."},
        {"id": "prune", "text": "Prune roses in late winter, cutting just above an outward-facing bud."},
    ],
    "finance": [
        {"id": "bonds", "text": "When interest rates rise, the prices of existing bonds fall."},
        {"id": "index", "text": "An index fund holds every stock of a market index at low cost."},
    ],
    "music": [
        {"id": "violin", "text": "A violin has four strings tuned in fifths: G, D, A and E."},
        {"id": "chord", "text": "A major chord stacks a root, a major third and a perfect fifth."},
    ],
}


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def summary_at(*points) -> SourceSummary:
    rows = unit(points)
    return SourceSummary(documents=10 * len(rows), centroids=rows, shares=np.full(len(rows), 1 / len(rows)),
                         sample=rows)


def test_route_sends_the_question_to_the_best_summaries_and_says_why_each_other_was_skipped():
    table = SummaryTable.stack({"a": summary_at([1, 0, 0]), "b": summary_at([0.9, 0.1, 0]),
                                "c": summary_at([0, 1, 0]), "d": summary_at([0, 0, 1], [0.7, 0.7, 0])})
    decision = route(unit([1, 0, 0]), table, RoutingSettings(widen_margin=0.0, budget=2), {"e": "no summary: reasons"},
                     ["f"])
    # the unscored source cannot be judged: it is asked, and takes one of the budget's places
    assert decision.asked == ["e", "a"]
    skipped = decision.skipped
    assert list(skipped) == ["b", "d", "c", "f"]  # best-scored first
    assert skipped.pop("f") == "holds no passages"
    assert all("routed out by summary" in why for why in skipped.values())
    decision = route(unit([1, 0, 0]), table, RoutingSettings(widen_margin=0.0, budget=3))
    assert decision.asked == ["a", "b", "d"]  # d by its second topic
    assert decision.scores["d"] == pytest.approx(0.7071, abs=1e-3)


def test_with_a_redundancy_weight_a_mirror_of_a_routed_source_gives_way():
    table = SummaryTable.stack({"manuals": summary_at([1, 0.1, 0]), "manuals-mirror": summary_at([1, 0.1, 0]),
                                "tickets": summary_at([0.8, 0, 0.6])})
    query = unit([1, 0, 0.2])
    assert route(query, table, RoutingSettings(widen_margin=0.0, budget=2)).asked == ["manuals", "manuals-mirror"]
    decision = route(query, table, RoutingSettings(widen_margin=0.0, budget=2, redundancy_weight=0.5))
    assert decision.asked == ["manuals", "tickets"]
    assert "redundancy penalty" in decision.skipped["manuals-mirror"] and "manuals" in decision.skipped["manuals-mirror"]


def test_where_the_summaries_score_alike_routing_asks_every_close_one_up_to_a_bound():
    # three sources score nearly the same for the query (every one holds some of everything); a fourth is off topic
    table = SummaryTable.stack({"shard-1": summary_at([1, 0.10, 0]), "shard-2": summary_at([1, 0.12, 0]),
                                "shard-3": summary_at([1, 0.14, 0]), "recipes": summary_at([0, 0, 1])})
    query = unit([1, 0, 0])
    assert route(query, table, RoutingSettings(widen_margin=0.0, budget=1)).asked == ["shard-1"]
    widened = route(query, table, RoutingSettings(budget=1, widen_margin=0.05))
    assert widened.asked == ["shard-1", "shard-2", "shard-3"] and widened.widened == 2
    assert "recipes" in widened.skipped and "not among the 3 asked" in widened.skipped["recipes"]
    bounded = route(query, table, RoutingSettings(budget=1, widen_margin=0.05, widen_max=2))
    assert bounded.asked == ["shard-1", "shard-2"]
    # where the scores separate, the budget holds
    separated = SummaryTable.stack({"astronomy": summary_at([1, 0, 0]), "cooking": summary_at([0.6, 0.8, 0]),
                                    "sailing": summary_at([0.5, 0, 0.87])})
    decision = route(query, separated, RoutingSettings(budget=1, widen_margin=0.05))
    assert decision.asked == ["astronomy"] and decision.widened == 0


def test_redde_counts_each_sources_sampled_passages_among_the_best_scaled_by_its_size(monkeypatch):
    monkeypatch.setattr("gradfuse.selection.routing.REDDE_TOP", 3)
    small = SourceSummary(10, unit([[1, 0]]), np.ones(1), unit([[1, 0.05], [1, 0.06]]))
    large = SourceSummary(1000, unit([[0, 1]]), np.ones(1), unit([[1, 0.2], [0, 1]]))
    far = SourceSummary(50, unit([[0, 1]]), np.ones(1), unit([[-1, 1]]))
    table = SummaryTable.stack({"small": small, "large": large, "far": far})
    scores = route(unit([1, 0]), table, RoutingSettings(widen_margin=0.0, router="redde", budget=1)).scores
    # the top 3 sampled: small's two (2 x 10/2) and one of large's (1 x 1000/2); far's none, ranked below by cosine
    assert scores["large"] > scores["small"] > 0 > scores["far"]


def test_a_summary_is_small_and_survives_the_wire():
    vectors = unit(np.random.default_rng(0).normal(size=(500, 384)))
    summary = summarize(vectors)
    assert summary.documents == 500 and len(summary.centroids) == 8 and len(summary.sample) == 16
    assert summary.shares.sum() == pytest.approx(1.0)
    assert np.allclose(np.linalg.norm(summary.centroids, axis=1), 1, atol=1e-5)
    sent = summary.wire("all-MiniLM-L6-v2")
    back = SourceSummary.from_wire(sent["documents"], sent["dimension"], sent["centroids"], sent["shares"],
                                   sent["sample"])
    assert np.allclose(back.centroids, summary.centroids, atol=1e-3) and back.documents == 500
    with pytest.raises(ValueError):
        SourceSummary.from_wire(500, 384, sent["centroids"], sent["shares"][:-1], sent["sample"])
    assert len(summarize(vectors[:20]).centroids) == 1  # a small source is one topic


def test_a_remote_of_thousands_of_sources_weighs_as_one_source_in_routing():
    """A remote's summaries merged (sources/gradfuse_remote.py) keep no more than one source's: under ReDDE its
    thousands of sampled vectors would otherwise fill the top passages and win every question."""
    rng = np.random.default_rng(1)
    query = unit(rng.normal(size=32))
    parts = [SourceSummary(MAX_CLAIMED_DOCUMENTS, unit(rng.normal(size=(8, 32)) + query), np.full(8, 0.125),
                           unit(rng.normal(size=(16, 32)) + query)) for _ in range(2000)]
    merged = SourceSummary.merged(parts)
    assert merged.documents == MAX_CLAIMED_DOCUMENTS and len(merged.centroids) == 8 and len(merged.sample) == 16
    assert merged.shares.sum() == pytest.approx(1.0)
    honest = summarize(unit(rng.normal(size=(400, 32)) + 1.2 * query))
    table = SummaryTable.stack({"partner": merged, "own": honest})
    decision = route(query, table, RoutingSettings(router="redde", budget=1, above=0), {}, {})
    assert decision.scores["partner"] <= MAX_CLAIMED_DOCUMENTS + 2  # at most one source's estimate (+ 2: counted)


def test_stage_one_reads_only_the_redundancy_it_needs_and_decides_as_with_every_pair():
    rng = np.random.default_rng(0)
    query = unit(rng.normal(size=32))
    documents = {f"s{i:02d}": unit(rng.normal(size=(5, 32)) + 2 * query * (i % 4)) for i in range(40)}
    for weight, measure in ((0.0, "copies"), (0.5, "similarity"), (0.5, "copies")):
        settings = SelectionSettings(redundancy_weight=weight, redundancy=measure, threshold=-10, max_sources=4)
        decision = select_sources(query, documents, settings)
        pairs = sum(len(row) for row in decision.redundancy.values()) // 2
        # lambda 0 reads no pair; otherwise each source left against each one chosen (the last one too: the gains
        # of those dropped are reported), 4 x 40 at most, not 40 x 39
        assert pairs == (0 if weight == 0 else sum(40 - step for step in range(1, 5)))
        every = {s: {t: source_redundancy(documents[s], documents[t], measure) for t in documents if t != s}
                 for s in documents}
        relevance = decision.relevance
        assert decision.sources == choose_sources(relevance, every, settings).sources
    few = select_sources(query, dict(list(documents.items())[:6]), SelectionSettings())
    assert all(len(row) == 5 for row in few.redundancy.values())  # small: every pair, for tuning's replay


@pytest.fixture(scope="module")
def topical(tmp_path_factory):
    """Six one-topic sources built by `gradfuse index each`."""
    root = tmp_path_factory.mktemp("topical")
    for name, rows in TOPICS.items():
        write_jsonl(root / "inputs" / f"{name}.jsonl", rows)
    (root / "inputs" / "notes.txt").write_text("not a JSONL file: left alone")
    result = CliRunner().invoke(app, ["index", "each", "jsonl", str(root / "inputs"), "--workspace",
                                      str(root / "ws")])
    assert result.exit_code == 0, result.output
    assert "6 sources" in result.output and "6 built" in result.output
    return root


def routed_workspace(root, **routing) -> Workspace:
    return Workspace(Config(workspace=root / "ws", routing=RoutingSettings(**{"widen_margin": 0.0} | routing)))


def test_only_the_routed_sources_are_asked_and_the_result_says_what_was_skipped(topical):
    assert all((p / "CURRENT").is_file() for p in (topical / "ws" / "sources").iterdir())
    version = next((topical / "ws" / "sources" / "sailing").glob("v-*"))
    assert (version / SUMMARY_FILE).is_file()
    with routed_workspace(topical, above=3, budget=2) as ws:
        result = ws.search("How do I tie a loop at the end of a mooring line?")
        assert len(result.routing.asked) == 2 and "sailing" in result.routing.asked
        assert set(result.ranked_lists) | {f.source for f in result.failures} == set(result.routing.asked)
        assert {name for name, _ in ws.catalog._sources} == set(result.routing.asked)  # the rest never opened
        assert set(result.routing.skipped) == set(TOPICS) - set(result.routing.asked)
        assert result.candidates[0].source == "sailing" and "routing" in result.timings
        record = json.loads(search_record(result).model_dump_json())
        assert record["routing"]["asked"] == result.routing.asked and len(record["routing"]["skipped"]) == 4
        # at or under `above` sources nothing is routed: today's behaviour
        assert ws.search("bowline", sources=["sailing", "music", "finance"]).routing is None
        # a request that names one source (single:) is never routed away from it
        assert ws.search("bowline", method="single:music").routing is None


def test_at_most_max_open_sources_stay_open_and_a_closed_one_opens_again(topical):
    with routed_workspace(topical, above=100, max_open=2) as ws:
        first = ws.catalog.source("astronomy")
        for name in ("music", "finance", "gardening"):
            assert ws.search("chords and strings", sources=[name], method="rrf").candidates
            assert len(ws.catalog._sources) <= 2
        assert first._searcher is None  # the least recently used was closed
        assert ws.guards["astronomy"]._executor is None
        again = ws.search("Phobos and Deimos", sources=["astronomy"], method="rrf")
        assert again.candidates[0].doc_id == "mars"
        ws.config.routing = RoutingSettings(above=100, max_open=1)
        ws.catalog.trim()
        assert list(ws.catalog._sources) == [("astronomy", "hybrid")]


def test_a_rebuilt_source_is_routed_by_its_new_summary(tmp_path):
    for name in ("astronomy", "cooking", "finance"):
        write_jsonl(tmp_path / "in" / f"{name}.jsonl", TOPICS[name])
    routing = RoutingSettings(widen_margin=0.0, above=1, budget=1)
    with Workspace(Config(workspace=tmp_path / "ws", routing=routing)) as ws:
        for name in ("astronomy", "cooking", "finance"):
            ws.index(SourceSpec(name, "jsonl", str(tmp_path / "in" / f"{name}.jsonl")))
        before = ws.search("a bowline knot on a sailboat").routing
        write_jsonl(tmp_path / "in" / "finance.jsonl", TOPICS["sailing"])  # finance now holds the sailing notes
        ws.index(SourceSpec("finance", "jsonl", str(tmp_path / "in" / "finance.jsonl")))
        after = ws.search("a bowline knot on a sailboat").routing
        assert after.asked == ["finance"] and after.scores["finance"] > before.scores["finance"] + 0.2


@pytest.fixture(scope="module")
def remote(tmp_path_factory, topical):
    """Another gradfuse serving the six topical sources."""
    with gradfuse_serve(topical / "ws") as url:
        yield url


def test_a_remote_gradfuse_sends_its_summaries_and_is_routed_by_them(remote, tmp_path):
    lines = ['workspace = "ws"', "[routing]", "above = 1", "budget = 1"]
    for name in ("sailing", "finance"):
        lines += [f"[sources.team-{name}]", 'kind = "gradfuse"', f'url = "{remote}"', f'sources = ["{name}"]']
    (tmp_path / "gradfuse.toml").write_text("\n".join(lines) + "\n")
    with Workspace(load_config(tmp_path / "gradfuse.toml")) as ws:
        ws.index(SourceSpec("music", "jsonl", str(write_jsonl(tmp_path / "music.jsonl", TOPICS["music"]))))
        unjudged = ws.search("Do bond prices fall when interest rates rise?")
        # no summary yet: a budget of one goes to the best-scored source, the unjudged remotes wait their turn;
        # their summaries are being made meanwhile
        waiting = {n for n, why in unjudged.routing.skipped.items() if "asked in turn" in why}
        assert unjudged.routing.asked == ["music"] and waiting == {"team-sailing", "team-finance"}
        assert ws.catalog.summaries.make(["team-sailing", "team-finance"]) == {"team-sailing": "", "team-finance": ""}
        routed = ws.search("Do bond prices fall when interest rates rise?")
        assert routed.routing.asked == ["team-finance"] and not routed.routing.unscored
        assert routed.candidates[0].doc_id == "finance/bonds"
        cached = list((tmp_path / "ws" / "cache" / "summaries").glob("team-finance-*.npz"))
        assert len(cached) == 1  # kept for the next start
    with Workspace(load_config(tmp_path / "gradfuse.toml")) as ws:  # restarted: read from the cache
        assert ws.search("Do bond prices fall when interest rates rise?").routing.asked == ["team-finance"]
    made = CliRunner().invoke(app, ["summarize", "--config", str(tmp_path / "gradfuse.toml")])
    assert made.exit_code == 0, made.output
    assert "team-sailing: summarised" in made.output and "music: built here" in made.output


def test_an_engines_summary_is_made_from_a_sample_read_through_its_own_client(tmp_path):
    lancedb = pytest.importorskip("lancedb")
    from gradfuse.embedding.encoder import load_encoder

    rows = TOPICS["sailing"] + TOPICS["gardening"]
    vectors = load_encoder("all-MiniLM-L6-v2").encode([r["text"] for r in rows])
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{"id": r["id"], "text": r["text"], "vector": v.tolist()} for r, v in zip(rows, vectors)])
    (tmp_path / "gradfuse.toml").write_text(f'workspace = "ws"\n[routing]\nabove = 1\nbudget = 1\n'
                                            f'[sources.store]\nkind = "lancedb"\nuri = "{tmp_path / "lance"}"\n'
                                            'table = "notes"\n')
    with Workspace(load_config(tmp_path / "gradfuse.toml")) as ws:
        for name in ("astronomy", "finance"):
            ws.index(SourceSpec(name, "jsonl", str(write_jsonl(tmp_path / f"{name}.jsonl", TOPICS[name]))))
        assert ws.catalog.summaries.make(["store"]) == {"store": ""}
        summary, _ = ws.catalog.summaries.get("store")
        assert summary.documents == len(rows) and len(summary.sample) == len(rows)
        routed = ws.search("When should roses be pruned?")
        assert routed.routing.asked == ["store"] and routed.candidates[0].doc_id == "prune"


def test_a_source_published_by_another_process_is_listed_at_once(tmp_path, monkeypatch):
    with Workspace(Config(workspace=tmp_path / "ws")) as reader, Workspace(Config(workspace=tmp_path / "ws")) as writer:
        writer.index(SourceSpec("music", "jsonl", str(write_jsonl(tmp_path / "m.jsonl", TOPICS["music"]))))
        assert reader.source_names() == ["music"]
        monkeypatch.setattr("gradfuse.federation.catalog.STAMP_SETTLED_NS", 0)  # trust the stamp however recent
        listings = reader.catalog.listings
        assert reader.source_names() == ["music"] and reader.catalog.listings == listings  # not listed again
        writer.index(SourceSpec("finance", "jsonl", str(write_jsonl(tmp_path / "f.jsonl", TOPICS["finance"]))))
        assert reader.source_names() == ["finance", "music"]  # the publish moved the stamp


def test_a_bad_summary_leaves_only_its_own_source_unjudged(topical, tmp_path):
    import shutil

    shutil.copytree(topical / "ws" / "sources", tmp_path / "ws" / "sources", symlinks=True)
    broken = next((tmp_path / "ws" / "sources" / "music").glob("v-*")) / SUMMARY_FILE
    broken.write_bytes(b"not a summary")
    routing = RoutingSettings(widen_margin=0.0, above=1, budget=2)
    with Workspace(Config(workspace=tmp_path / "ws", routing=routing)) as ws:
        routed = ws.search("Do bond prices fall when interest rates rise?").routing
        assert "could not be read" in routed.unscored["music"] and "finance" in routed.asked
        assert len(routed.asked) == 2  # the unjudged one and the best judged one
        table, unscored, _ = ws.catalog.summaries.table(ws.source_names(), 7)  # another encoder's space
        assert not table.names and all("dimension 384, not 7" in why for n, why in unscored.items() if n != "music")


def test_a_remote_summary_is_checked_and_made_unit_length():
    rows = np.full((1, 4), 60000.0, dtype=np.float32)
    sent = SourceSummary(5, rows, np.ones(1), rows).wire("x")
    summary = SourceSummary.from_wire(5, 4, sent["centroids"], [1.0], sent["sample"])
    assert np.allclose(np.linalg.norm(summary.centroids, axis=1), 1)  # a remote's scale cannot win the routing
    nan = SourceSummary(5, np.full((1, 4), np.nan, np.float32), np.ones(1), rows).wire("x")
    for args in ((5, 4, nan["centroids"], [1.0], sent["sample"]), (5, 4, sent["centroids"], [1.0], ""),
                 (5, 4, sent["centroids"], [float("inf")], sent["sample"]), (5, 3, sent["centroids"], [1.0], "")):
        with pytest.raises(ValueError):
            SourceSummary.from_wire(*args)


def test_a_remote_summary_cannot_claim_more_than_a_summary_holds():
    vectors = unit(np.random.default_rng(1).normal(size=(500, 8)))
    sent = summarize(vectors).wire("x")
    claimed = SourceSummary.from_wire(10**15, 8, sent["centroids"], sent["shares"], sent["sample"])
    assert claimed.documents == MAX_CLAIMED_DOCUMENTS  # ReDDE weighs a source by its size: a lie is bounded
    many = summarize(np.tile(vectors, (3, 1)))  # 16 sampled vectors; 48 when three are sent as one
    tripled = base64.b64encode(np.tile(np.frombuffer(base64.b64decode(many.wire("x")["sample"]), np.float16),
                                       3).tobytes()).decode()
    with pytest.raises(ValueError, match="1 to 16 sampled vectors"):
        SourceSummary.from_wire(500, 8, sent["centroids"], sent["shares"], tripled)


def test_summaries_that_fail_are_retried_later_and_never_stop_the_others(tmp_path, monkeypatch):
    lines = ['workspace = "ws"'] + [line for name in ("a", "a-b") for line in (
        f"[sources.{name}]", 'kind = "lancedb"', f'uri = "{tmp_path / "nowhere"}"', 'table = "t"')]
    (tmp_path / "gradfuse.toml").write_text("\n".join(lines) + "\n")
    with Workspace(load_config(tmp_path / "gradfuse.toml")) as ws:
        outcome = ws.catalog.summaries.make(["a", "a-b"])
        assert all("sampling it failed" in why for why in outcome.values())
        made = ws.catalog.summaries._made["a"]
        assert made.failures == 1 and not ws.catalog.summaries._due(made)  # not again at the next question
        monkeypatch.setattr("gradfuse.federation.summaries.RETRY_S", 0.0)
        assert ws.catalog.summaries._due(made)
        # a summary saved for "a-b" is not taken for "a"'s old one
        (tmp_path / "ws" / "cache" / "summaries").mkdir(parents=True)
        other = tmp_path / "ws" / "cache" / "summaries" / "a-b-0123456789abcdef.npz"
        summarize(unit(np.eye(4))).save(other)
        monkeypatch.setattr(ws.catalog.summaries, "_sampled", lambda name: (summarize(unit(np.eye(4))), None))
        assert ws.catalog.summaries.make(["a"]) == {"a": ""} and other.is_file()


def test_index_each_builds_the_good_entries_and_reports_the_others(tmp_path):
    write_jsonl(tmp_path / "in" / "sailing.jsonl", TOPICS["sailing"])
    write_jsonl(tmp_path / "in" / "bad name!.jsonl", TOPICS["music"])
    (tmp_path / "in" / "folder.jsonl").mkdir()  # not a file
    write_jsonl(tmp_path / "in" / ".hidden.jsonl", TOPICS["music"])
    result = CliRunner().invoke(app, ["index", "each", "jsonl", str(tmp_path / "in"), "--workspace",
                                      str(tmp_path / "ws")])
    assert result.exit_code == 1
    assert "1 sources" in result.output and "not built bad name!.jsonl" in result.output
    with Workspace(Config(workspace=tmp_path / "ws")) as ws:
        assert ws.source_names() == ["sailing"]


def test_when_every_source_is_empty_nothing_is_asked(tmp_path):
    lancedb = pytest.importorskip("lancedb")
    import pyarrow as pa

    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("vector", pa.list_(pa.float32(), 384))])
    lancedb.connect(str(tmp_path / "lance")).create_table("empty", schema=schema)
    lines = ['workspace = "ws"', "[routing]", "above = 1", "budget = 1"] + [line for name in ("a", "b") for line in (
        f"[sources.{name}]", 'kind = "lancedb"', f'uri = "{tmp_path / "lance"}"', 'table = "empty"')]
    (tmp_path / "gradfuse.toml").write_text("\n".join(lines) + "\n")
    with Workspace(load_config(tmp_path / "gradfuse.toml")) as ws:
        assert ws.catalog.summaries.make(["a", "b"]) == {"a": "", "b": ""}
        result = ws.search("anything")
        assert result.routing.asked == [] and not result.ranked_lists and not result.failures
        assert result.routing.skipped == {"a": "holds no passages", "b": "holds no passages"}


def test_letting_a_guards_idle_workers_go_never_fails_a_call_being_submitted():
    import threading

    from gradfuse.federation.guard import GuardSettings, SourceGuard

    guard, stop = SourceGuard("churned", GuardSettings()), threading.Event()

    def churn():
        while not stop.is_set():
            guard.release()

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        assert all(guard.submit(lambda: 1).result(timeout=10) == 1 for _ in range(3000))
    finally:
        stop.set()
        churner.join()
        guard.close()


def test_unjudged_sources_take_only_their_share_of_the_budget_in_turn_and_an_open_breaker_is_not_asked():
    """Issue 58 M2: every source without a summary was asked, beyond the budget, ahead of every scored one."""
    table = SummaryTable.stack({"a": summary_at([1, 0, 0]), "b": summary_at([0.9, 0.1, 0]),
                                "c": summary_at([0, 1, 0])})
    unscored = {"down1": "could not be read", "down2": "could not be read", "down3": "could not be read"}
    settings = RoutingSettings(widen_margin=0.0, budget=4)  # a quarter of it: one place for the unjudged
    turns = [route(unit([1, 0, 0]), table, settings, unscored, turn=turn) for turn in range(3)]
    assert [d.asked for d in turns] == [["down1", "a", "b", "c"], ["down2", "a", "b", "c"], ["down3", "a", "b", "c"]]
    assert "asked in turn" in turns[0].skipped["down2"] and "asked in turn" in turns[0].skipped["down3"]
    # a source whose breaker is open is skipped with that reason, and the next best takes its place
    decision = route(unit([1, 0, 0]), table, RoutingSettings(widen_margin=0.0, budget=2), unscored,
                     unavailable={"a": "its breaker is open", "down1": "its breaker is open"})
    assert decision.asked == ["down2", "b"]
    assert decision.skipped["a"] == "its breaker is open" and decision.skipped["down1"] == "its breaker is open"
    # what the scored sources leave of the budget goes to the unjudged; a budget of one is the best-scored's
    many = {f"new{i}": "no summary yet" for i in range(10)}
    assert len(route(unit([1, 0, 0]), table, RoutingSettings(widen_margin=0.0, budget=24), many).asked) == 13
    assert route(unit([1, 0, 0]), table, RoutingSettings(widen_margin=0.0, budget=1), many).asked == ["a"]
    wide_share = RoutingSettings(widen_margin=0.0, budget=4, unscored_share=3.0)
    assert len(route(unit([1, 0, 0]), table, wide_share, many).asked) == 4


def test_down_remotes_without_summaries_no_longer_starve_a_local_source(tmp_path):
    """Issue 58 M2 end to end: two unreachable remotes and a budget of 2 failed every question."""
    remotes = "".join(f'[sources.down{i}]\nkind = "gradfuse"\nurl = "http://127.0.0.1:9"\ntimeout_s = 2\n'
                      for i in (1, 2))
    (tmp_path / "gradfuse.toml").write_text(f'workspace = "ws"\n[routing]\nabove = 0\nbudget = 2\n{remotes}')
    ws = Workspace.open(tmp_path / "gradfuse.toml")
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    try:
        for _ in range(2):
            result = ws.search("How is risotto cooked?", method="rrf", k=3)
            assert "cooking" in result.routing.asked and len(result.routing.asked) == 2
            assert result.candidates and result.candidates[0].source == "cooking"
    finally:
        ws.close()


def test_sources_routed_past_for_open_breakers_are_reported_as_failures(tmp_path):
    """Review of issue 58's M2: with every routed source's breaker open, a search answered nothing and said nothing."""
    from gradfuse.federation.federated import AllSourcesFailed

    (tmp_path / "gradfuse.toml").write_text('workspace = "ws"\n[routing]\nabove = 0\n')
    ws = Workspace.open(tmp_path / "gradfuse.toml")
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    try:
        breaker = ws.guards["cooking"].breaker
        for _ in range(breaker.failures_to_open):
            breaker.failed("error")
        with pytest.raises(AllSourcesFailed, match="circuit breaker is open"):
            ws.search("How is risotto cooked?", method="rrf", k=3)
    finally:
        ws.close()


def test_why_a_source_has_no_summary_is_told_only_to_a_key_that_reads_everything(tmp_path):
    """Issue 58 L1: a document-limited key was shown the background worker's error, with a remote's address."""
    from gradfuse.access import Principal

    (tmp_path / "gradfuse.toml").write_text('workspace = "ws"\n[routing]\nabove = 0\n[sources.team]\n'
                                            'kind = "gradfuse"\nurl = "http://127.0.0.1:9"\ntimeout_s = 2\n')
    ws = Workspace.open(tmp_path / "gradfuse.toml")
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    try:
        full = ws.search("How is risotto cooked?", method="rrf", k=3)
        limited = ws.search("How is risotto cooked?", method="rrf", k=3, principal=Principal("bob"))
        assert "team" in full.routing.unscored and "team" in limited.routing.unscored
        assert limited.routing.unscored["team"] == "no summary to judge it by"
        assert "127.0.0.1" not in json.dumps(search_record(limited).routing.model_dump())
        # nor is where a failed source lives (review of issue 58): its failure says why, not its address
        assert "127.0.0.1" in full.failures[0].detail
        assert "127.0.0.1" not in json.dumps(search_record(limited).model_dump())
        assert "cannot be reached" in limited.failures[0].detail
    finally:
        ws.close()
