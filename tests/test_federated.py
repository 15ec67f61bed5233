"""Querying several real sources at once, when some of them are dead or slow."""

import threading
import time

import pytest

from conftest import COOKING, write_jsonl

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config, SourceSettings
from gradfuse.federation.federated import AllSourcesFailed, ask_sources, query_sources
from gradfuse.federation.guard import Guards, GuardSettings


class DeadSource:
    """A source whose backend is gone: every search raises."""

    name = "dead"

    def warm(self):
        pass

    def search(self, query, k):
        raise ConnectionError("index server refused the connection")


class HangingSource:
    """A source that does not answer until released (or 30 s pass)."""

    name = "slow"

    def __init__(self):
        self.release = threading.Event()

    def warm(self):
        pass

    def search(self, query, k):
        self.release.wait(30)
        return []


def test_a_dead_and_a_slow_source_are_reported_and_the_others_still_answer(workspace):
    real = [workspace.source("astronomy", "bm25"), workspace.source("cooking", "bm25")]
    hanging = HangingSource()
    started = time.perf_counter()
    result = query_sources([*real, DeadSource(), hanging], "planet moons", 5,
                           {"astronomy": 5.0, "cooking": 5.0, "dead": 5.0, "slow": 0.5}, Guards())
    elapsed = time.perf_counter() - started
    hanging.release.set()
    assert set(result.ranked_lists) == {"astronomy", "cooking"}
    failures = {f.source: f for f in result.failures}
    assert failures["dead"].reason == "error" and "refused the connection" in failures["dead"].detail
    assert failures["slow"].reason == "timeout" and "0.5 s" in failures["slow"].detail
    assert elapsed < 5.0  # the hanging source did not hold the answer back to the others' timeout
    assert result.ranked_lists["astronomy"][0].doc_id == "mars"


def test_a_callers_shorter_deadline_does_not_count_toward_the_breaker_and_its_own_does(workspace):
    """A request's own short timeout_s says nothing of the source: no caller may open its breaker for every other.
    The source's own deadline counts, and so does `busy` once a call late by it holds a worker."""
    astronomy = workspace.source("astronomy", "bm25")

    def ask(guards, hanging, slow_deadline, own_deadline):
        by_name = {"astronomy": astronomy, "slow": hanging}
        result = ask_sources(list(by_name), lambda name: (by_name[name], lambda: None), "planet moons", 5,
                             {"astronomy": 5.0, "slow": slow_deadline}, guards, None,
                             {"astronomy": 5.0, "slow": own_deadline})
        return [f.reason for f in result.failures if f.source == "slow"]

    for own_deadline, breaker in ((5.0, "closed"), (0.05, "open")):
        guards, hanging = Guards(GuardSettings(breaker_failures=3)), HangingSource()
        try:
            reasons = [r for _ in range(guards.settings.workers + 2) for r in ask(guards, hanging, 0.05, own_deadline)]
            if breaker == "closed":  # its late calls hold half the workers, the most they may, then it is busy for
                half = guards.settings.workers // 2  # such calls: none of it counted
                assert reasons == ["timeout"] * half + ["busy"] * (half + 2)
                assert guards["slow"].breaker.failures == 0
            else:  # its own deadline: counted, and the breaker opens, its reason named, never a detail
                assert reasons[:3] == ["timeout"] * 3 and reasons[-1] == "open"
                assert "the last: timeout" in guards["slow"].open_error().args[0]
            assert guards.state("slow") == breaker
        finally:
            hanging.release.set()
            guards.close()


def test_all_sources_failing_is_one_clear_error_naming_each():
    hanging = HangingSource()
    with pytest.raises(AllSourcesFailed) as raised:
        query_sources([DeadSource(), hanging], "anything", 5, {"dead": 1.0, "slow": 0.2}, Guards())
    hanging.release.set()
    message = str(raised.value)
    assert "every source failed" in message and "dead: ConnectionError" in message and "slow: no answer" in message


def test_workspace_search_fuses_across_sources_and_merges_the_shared_passage(workspace):
    result = workspace.search("Which planet has the moons Phobos and Deimos?", method="rrf", k=3, retrieval="bm25")
    assert result.failures == []
    top = result.candidates[0]
    assert top.text.startswith("Mars is the fourth planet")
    assert sorted(top.sources) == ["astronomy", "cooking"]  # one candidate, both provenances
    assert top.scores["fusion:rrf"] == pytest.approx(2 / 61)
    assert set(result.ranked_lists) == {"astronomy", "cooking"}


def test_workspace_rejects_unknown_sources_and_methods_clearly(workspace):
    with pytest.raises(Exception, match="unknown source.*nope.*available: astronomy, cooking"):
        workspace.search("planets", sources=["nope"])
    with pytest.raises(Exception, match="unknown method 'best'"):
        workspace.search("planets", method="best")
    with pytest.raises(ValueError, match="empty"):
        workspace.search("   ")


def test_fusion_over_real_source_lists_keeps_native_ranks(workspace):
    result = workspace.search("carbon dioxide", method="concat", k=10, retrieval="bm25")
    for candidate in result.candidates:
        own = result.ranked_lists[candidate.source]
        assert own[candidate.native_rank - 1] is candidate
    assert {c.doc_id for c in result.candidates} == {"venus", "bread"}


def test_source_weights_from_the_config_reach_the_fusion(workspace):
    weighted = Workspace(Config(workspace=workspace.root, sources={"cooking": SourceSettings(weight=3.0)}))
    result = weighted.search("carbon dioxide", method="rrf", k=2, retrieval="bm25")
    assert [(c.source, c.doc_id) for c in result.candidates] == [("cooking", "bread"), ("astronomy", "venus")]
    assert result.candidates[0].scores["fusion:rrf"] == pytest.approx(3 / 61)


def test_rrf_over_hybrid_sources_ranks_the_passage_both_rankings_agree_on_first_whatever_the_names(
        tmp_path, corpus_dir):
    """Each source fuses its BM25 and dense rankings; federated RRF fuses those rankings again as lists of their
    own. Fused as one list per source, every source's first hit tied at 1/61 and came in the sources' name order."""
    ws = Workspace(Config(workspace=tmp_path / "ws", retrieval="hybrid"))
    ws.index(SourceSpec("a-cooking", "jsonl", str(write_jsonl(tmp_path / "cooking.jsonl", COOKING[:2]))))
    ws.index(SourceSpec("b-gardening", "jsonl", str(write_jsonl(tmp_path / "garden.jsonl", [
        {"id": "tomato", "title": "Tomatoes", "text": "Red tomatoes ripen in full sun; a brown spot on the fruit "
                                                      "means blossom end rot."},
        {"id": "roses", "title": "Roses", "text": "Prune roses in late winter, just above an outward-facing bud."},
    ]))))
    ws.index(SourceSpec("c-astronomy", "beir", str(corpus_dir / "astronomy")))
    result = ws.search("Which planet has the Great Red Spot?", method="rrf", k=3)
    first = result.candidates[0]
    assert (first.source, first.doc_id) == ("c-astronomy", "jupiter")
    assert first.retrieval_ranks == {"bm25": 1, "dense": 1}
    assert first.scores["fusion:rrf"] == pytest.approx(2 / 61)


def test_bm25_ranks_the_passage_holding_a_date_whole_above_passages_holding_its_parts(tmp_path):
    """"2003-09-19" is three common tokens; asked as a phrase as well, the row of that day comes first (before, the
    rows richest in "2003", "09" and "19" apart did)."""
    days = [f"2003-{month:02d}-{day:02d} | 2{day}.{month}0 | 19{month:02d}0{day:02d}" for month in (8, 9)
            for day in range(10, 30)]
    rows = [{"id": f"rows-{i}", "title": "MSFT 2003", "text": "Date | Close | Volume\n" + "\n".join(days[i:i + 4])}
            for i in range(0, len(days), 4)]
    rows.append({"id": "noise", "title": "Counts", "text": "19 09 19 09 2003 2003 19 09 and 2003 again: 19, 09."})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("prices", "jsonl", str(write_jsonl(tmp_path / "prices.jsonl", rows))))
    first = ws.search("closing price on 2003-09-19", method="concat", k=3, retrieval="bm25").candidates[0]
    assert "2003-09-19 |" in first.text, first.text


@pytest.mark.parametrize("query", ["AND", "x IN y", "NOT a planet", "rock AND-OR roll", 'title:"Mars" OR'])
def test_bm25_reads_operator_words_and_syntax_as_plain_words(workspace, query):
    """tantivy's parser took an upper-case AND, OR, NOT or IN as an operator: a syntax error, or a different query."""
    workspace.search(query, method="concat", k=3, retrieval="bm25")  # answers, whatever the words
    mars = workspace.search("Mars AND Jupiter", method="concat", k=5, retrieval="bm25").candidates
    assert {c.doc_id for c in mars} >= {"mars", "jupiter"}  # either word suffices: no AND was applied


def test_a_cold_encoder_loads_before_the_sources_timeouts_start(workspace, monkeypatch):
    """The first search of a process loads the encoder (seconds on a busy machine): loaded inside the first source's
    thread, it counted against every source's timeout and a cold search failed with "every source failed"."""
    import gradfuse.sources.embedded as embedded

    real, cold = embedded.load_encoder, [True]

    def load_cold_once(name):  # the real encoder, its first load made slower than the timeout
        if cold:
            cold.clear()
            time.sleep(1.5)
        return real(name)

    monkeypatch.setattr(embedded, "load_encoder", load_cold_once)
    result = workspace.search("Which planet has two moons?", method="rrf", k=2, retrieval="hybrid", timeout_s=1.0)
    assert not result.failures and result.candidates[0].doc_id.startswith("mars")
    assert not cold  # the load did happen, once
