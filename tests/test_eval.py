"""The evaluation harness: benchmark files, splits that keep tuning off the test queries, QA metrics, and the
quick variant of every committed benchmark checked against its stored expected scores (real data, real models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gradfuse import Workspace
from gradfuse.config import Config, ConfigError
from gradfuse.eval import load_benchmark
from gradfuse.eval.benchmark import read_qrels, sample_queries
from gradfuse.eval.expected import check_expected, write_expected
from gradfuse.eval.qa import answer_in_context, exact_match, f1
from gradfuse.eval.runner import Evaluation, _tuning_groups, queries_and_qrels
from gradfuse.indexing.build import read_documents
from gradfuse.ingest.documents import IngestReport

pytestmark = pytest.mark.usefixtures("bench_workspaces")  # see conftest.py

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _shared_data() -> Path | None:
    try:
        return load_benchmark(BENCHMARKS / "dl19.toml").data
    except ConfigError:
        return None


# The benchmarks read the shared evaluation data, which lives outside the repository (never copied into it).
needs_data = pytest.mark.skipif(_shared_data() is None, reason="no shared evaluation data here: set GRADFUSE_DATA "
                                "(the Makefile looks in ../shared/data and /work/shared/data)")


def _queries(bench):
    return [q for qs in bench.query_sets.values() for q in sample_queries(bench, qs, read_qrels(qs))]


@needs_data
def test_holdout_split_is_seeded_and_keeps_dev_apart_from_test():
    bench = load_benchmark(BENCHMARKS / "federated.toml", quick=True)
    first, again = _queries(bench), _queries(bench)
    assert first == again
    test = {q.query_id for q in first if q.split == "test"}
    dev = {q.query_id for q in first if q.split == "dev"}
    assert not test & dev
    assert len(test) == bench.sample * len(bench.query_sets) and len(dev) == bench.dev * len(bench.query_sets)
    groups = _tuning_groups(Evaluation(bench, first, {}, {}, {}, {}, {}, {}, []))
    assert len(groups) == 1 and set(groups[0][0]) == dev  # tuned on dev only


@needs_data
def test_a_set_too_small_for_both_splits_keeps_the_proportion():
    bench = load_benchmark(BENCHMARKS / "federated.toml")
    dbpedia = [q for q in sample_queries(bench, bench.query_sets["dbpedia"], read_qrels(bench.query_sets["dbpedia"]))]
    dev = [q for q in dbpedia if q.split == "dev"]
    assert len(dbpedia) == 40 and len(dev) == round(40 * bench.dev / (bench.sample + bench.dev))


@needs_data
def test_cross_fitting_tests_every_query_once_with_values_tuned_on_the_other_folds():
    bench = load_benchmark(BENCHMARKS / "dl19.toml")
    queries = _queries(bench)
    assert {q.split for q in queries} == {"test"} and len(queries) == 43
    groups = _tuning_groups(Evaluation(bench, queries, {}, {}, {}, {}, {}, {}, []))
    assert len(groups) == bench.folds
    applied = [q for _, fold in groups for q in fold]
    assert sorted(applied) == sorted(q.query_id for q in queries)
    for dev, fold in groups:
        assert not set(dev) & set(fold) and len(dev) + len(fold) == 43


@needs_data
def test_benchmark_file_errors_name_the_problem(tmp_path, monkeypatch):
    broken = tmp_path / "b.toml"
    broken.write_text((BENCHMARKS / "federated.toml").read_text().replace('"select",', '"selct",')
                      .replace('"../../shared/data"', f'"{_shared_data()}"'))
    with pytest.raises(ConfigError, match="selct"):
        load_benchmark(broken)
    monkeypatch.delenv("GRADFUSE_DATA", raising=False)  # the Makefile exports it; here the file's path must count
    broken.write_text('data = "nowhere"\n')
    with pytest.raises(ConfigError, match="GRADFUSE_DATA"):
        load_benchmark(broken)
    # Issue 58 L8: a misspelt folder is named as missing, even where a shared/data folder lies above the file
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "bench").mkdir()
    misspelt = tmp_path / "bench" / "b.toml"
    misspelt.write_text('data = "../../shraed/data"\n')
    with pytest.raises(ConfigError, match="shraed"):
        load_benchmark(misspelt)
    with pytest.raises(ConfigError, match="no \\[quick\\] section"):
        broken.write_text(f'data = "{tmp_path}"\n')
        load_benchmark(broken, quick=True)


@needs_data
def test_a_collection_in_parts_is_built_and_judged_in_the_part_that_holds_each_document(tmp_path):
    bench = load_benchmark(BENCHMARKS / "spread.toml")
    report = IngestReport()
    halves = [{d.doc_id for d in read_documents(bench.sources[f"scifact-{i}"], report)} for i in (1, 2)]
    whole = {d.doc_id for d in read_documents(replace(bench.sources["scifact-1"], options={}), report)}
    assert halves[0] and halves[1] and not halves[0] & halves[1] and halves[0] | halves[1] == whole
    queries, qrels, origins = queries_and_qrels(bench)
    for query in queries:
        for key, relevance in qrels[query.query_id].items():
            source, doc_id = key.split("/", 1)
            assert doc_id in halves[int(source[-1]) - 1] if source.startswith("scifact") else source[-1] in "12"
    assert any(len(origins[q.query_id]) == 2 for q in queries)  # some requests need both parts
    text = (BENCHMARKS / "spread.toml").read_text().replace('"../../shared/data"', f'"{_shared_data()}"')
    broken = tmp_path / "b.toml"
    broken.write_text(text.replace('origin = ["scifact-1", "scifact-2"]', 'origin = ["scifact-1", "dbpedia"]'))
    with pytest.raises(ConfigError, match="parts 1/2 to 2/2"):
        load_benchmark(broken)
    broken.write_text(text.replace('part = "2/2"', 'part = "3/2"', 1))
    with pytest.raises(ValueError, match="between 1 and n"):
        load_benchmark(broken)


def test_answer_metrics_normalise_and_skip_what_a_string_match_cannot_check():
    assert answer_in_context(("$1,496.5",), ["Total sales were 1,496.5 million in 2019"]) == 1.0
    assert answer_in_context(("The Dark Knight",), ["dark knight rises"]) == 1.0  # articles and case ignored
    assert answer_in_context(("a spirit",), ["spiritual leader"]) == 0.0  # whole words only
    assert answer_in_context(("yes",), ["yes it is"]) is None
    assert exact_match("The spirit.", ("a spirit",)) == 1.0
    assert f1("a demon spirit", ("spirit",)) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1("nothing", ("spirit",)) == 0.0


def test_a_moved_score_is_reported_beyond_one_swap_on_one_query(tmp_path):
    summary = {"command": "c", "commit": "x", "tables": [{"name": "t", "rows": [
        {"method": "rrf", "ndcg@10": {"mean": 0.5, "ci95": [0.4, 0.6], "queries": 10},
         "mrr@10": {"mean": 0.5, "ci95": [0.4, 0.6], "queries": 40}}]}]}
    expected = tmp_path / "e.json"
    write_expected(expected, summary)
    assert check_expected(expected, summary) == []
    row = summary["tables"][0]["rows"][0]
    row["ndcg@10"]["mean"] = 0.5 + 0.036  # under one swapped pair on one of 10 queries (0.037)
    row["mrr@10"]["mean"] = 0.5 + 0.019  # 0.5 / 40 is under the floor of 0.02
    assert check_expected(expected, summary) == []
    row["ndcg@10"]["mean"] = 0.54
    row["mrr@10"]["mean"] = 0.47
    assert check_expected(expected, summary) == ["t: rrf ndcg@10 expected 0.5000 ± 0.037, got 0.5400",
                                                 "t: rrf mrr@10 expected 0.5000 ± 0.02, got 0.4700"]
    summary["tables"][0]["rows"] = []
    assert "not produced" in check_expected(expected, summary)[0]


def test_a_set_method_ranks_from_the_pool_its_own_order_scores_best_on_dev():
    """conditional and set-upr are not mixed with a prior, so the pool is their only dev choice; a tie keeps the
    first pool."""
    from types import SimpleNamespace

    from gradfuse.eval.outcome import Outcome
    from gradfuse.eval.runner import _own_order_pool

    qrels = {str(q): {f"{q}-rel": 1} for q in range(4)}

    def run_dev(pool):  # rrf ranks the relevant document first, cosine last, combsum-z as rrf does
        order = ["rel", "x", "y"] if pool != "cosine" else ["x", "y", "rel"]
        return {q: Outcome([(f"{q}-{d}", 3.0 - i) for i, d in enumerate(order)], ["s"], 0.1, []) for q in qrels}

    evaluation = SimpleNamespace(bench=SimpleNamespace(tuning_metric="ndcg@10", folds=0), qrels=qrels, tuned={})
    pool = _own_order_pool(evaluation, "conditional", 0, ["cosine", "rrf", "combsum-z"], run_dev, list(qrels))
    assert pool == "rrf"  # above cosine, and before combsum-z, which ties it
    chosen = evaluation.tuned["conditional stage 2"]
    assert chosen["chosen"] == {"pool": "rrf", "dev_ndcg@10": 1.0} and chosen["pools"]["cosine"]["dev_ndcg@10"] < 1

    def unrun(pool):
        raise AssertionError("one pool: nothing to choose, so no dev run")

    evaluation.tuned = {}  # one pool: it is the choice, recorded as such (tune writes it from the record)
    assert _own_order_pool(evaluation, "conditional", 0, ["cosine"], unrun, list(qrels)) == "cosine"
    assert evaluation.tuned["conditional stage 2"]["chosen"] == {"pool": "cosine"}


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("name", ["federated", "dl19", "qa"])
def test_quick_benchmark_reproduces_its_expected_scores(name, tmp_path):
    """The committed command, from scratch: indexes, every method (scoring LM included), the results folder."""
    out = tmp_path / name
    command = [str(Path(sys.executable).with_name("gradfuse")), "eval", str(BENCHMARKS / f"{name}.toml"), "--quick",
               "--check", "--out", str(out), "--runs", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "results.json").read_text())
    assert (out / "results.md").is_file() and list(out.glob("*.png")) and summary["finished"] is True
    assert summary["commit"] not in ("", "unknown") and "bf16 native" in summary["machine"]
    lm_rows = [row for row in summary["tables"][-1]["rows"] if row["method"].split("/")[0].split(":")[0] == "gro"]
    signal = load_benchmark(BENCHMARKS / f"{name}.toml", quick=True).lm_options.get("scorer", "upr")  # the file's, or UPR
    assert lm_rows and all(row["scorer"] == signal for row in lm_rows)  # which stage-2 signal gro's row ran
    every_method = summary["tables"][-1]["rows"]  # the last table holds every method, scoring-LM ones included
    assert len(list((tmp_path / "runs").glob("*.trec"))) == len(every_method)
    # select's stage 1 tuned both ways on dev: hard (`select`) and soft (`select:soft`), each a row of its own
    methods = {row["method"] for row in every_method}
    assert {"select", "select:soft"} <= methods
    soft = summary["tuned"]["soft selection"]
    for tuned in [soft] if "settings" in soft else soft.values():  # one per fold where the file cross-fits
        assert tuned["settings"]["choice"] == "soft" and len(tuned["dev_grid"]) > 1


def test_the_prior_mix_reorders_only_the_scored_head():
    from gradfuse.eval.outcome import Outcome
    from gradfuse.eval.tuning import mix_prior

    head = [{"key": "a", "prior": 0.9, "rerank:gate": -1.0}, {"key": "b", "prior": 0.5, "rerank:gate": 2.0},
            {"key": "c", "prior": 0.1, "rerank:gate": 0.5}]
    outcome = Outcome([("b", 5.0), ("c", 4.0), ("a", 3.0), ("tail1", 2.0), ("tail2", 1.0)], ["s"], 0.1, head)
    by_gradient = [key for key, _ in mix_prior(outcome, "rerank:gate", "prior", "zsum", 0.0).ranking]
    by_prior = [key for key, _ in mix_prior(outcome, "rerank:gate", "prior", "zsum", 100.0).ranking]
    within_two = [key for key, _ in mix_prior(outcome, "rerank:gate", "prior", "within", 2).ranking]
    prior_alone = [key for key, _ in mix_prior(outcome, "rerank:gate", "prior", "within", 0).ranking]
    assert by_gradient == ["b", "c", "a", "tail1", "tail2"]
    assert by_prior == prior_alone == ["a", "b", "c", "tail1", "tail2"]
    assert within_two == ["b", "a", "c", "tail1", "tail2"]  # only the prior's first two are reordered


def test_the_mix_is_chosen_on_dev_and_a_useless_score_leaves_the_prior(tmp_path):
    """A score that ranks the relevant document last: the dev choice must fall back to the prior's order."""
    from gradfuse.eval.outcome import Outcome
    from gradfuse.eval.tuning import best_mix, mix_prior

    qrels, outcomes = {}, {}
    for q in range(6):
        head = [{"key": f"{q}-rel", "prior": 0.9, "rerank:upr": -5.0},
                {"key": f"{q}-x", "prior": 0.5, "rerank:upr": 1.0}, {"key": f"{q}-y", "prior": 0.1, "rerank:upr": 2.0}]
        qrels[str(q)] = {f"{q}-rel": 1}
        outcomes[str(q)] = Outcome([(row["key"], 3.0 - i) for i, row in enumerate(head)], ["s"], 0.1, head,
                                   score_key="rerank:upr")
    point, score, grid = best_mix(qrels, outcomes, list(outcomes), ["rerank:upr"], ["prior"], "ndcg@10")
    assert score == pytest.approx(1.0) and len(grid) == 10
    assert [k for k, _ in mix_prior(outcomes["0"], "rerank:upr", "prior", point["mix"], point["value"]).ranking][0] \
        == "0-rel"


@needs_data
def test_the_quick_check_fails_on_a_deliberately_altered_fusion(monkeypatch):
    """The tolerances absorb a swapped pair, not a change of method: RRF with k = 1 instead of 60 must be caught."""
    from gradfuse import fusion
    from gradfuse.eval import run_benchmark
    from gradfuse.eval.expected import expected_path
    from gradfuse.eval.report import summarise

    bench = load_benchmark(BENCHMARKS / "dl19.toml", quick=True)
    bench.methods = ["single:*", "rrf", "combsum-z"]  # the cheap rows are enough to show it

    def moved() -> list[str]:
        summary = summarise(run_benchmark(bench, progress=False))
        return [p for p in check_expected(expected_path(bench.file, quick=True), summary) if "not produced" not in p]

    assert moved() == []
    monkeypatch.setattr(fusion, "RRF_K", 1)
    problems = moved()
    assert problems and all(": rrf " in p for p in problems), problems


def test_a_method_that_ran_on_some_queries_is_judged_on_those_alone():
    """The oracles run on `[lm] oracle_sample` queries only: a query they did not rank must not count as empty."""
    from gradfuse.eval.benchmark import Benchmark, EvalQuery
    from gradfuse.eval.report import _rows
    from gradfuse.eval.outcome import Outcome

    bench = Benchmark("t", Path("t.toml"), Path("."), Path("."), {}, {}, ["rrf", "loo/gold"], ["ndcg@10"])
    queries = [EvalQuery(f"s/q{i}", "q", "s", "test") for i in range(4)]
    qrels = {q.query_id: {"s/good": 1} for q in queries}
    perfect = Outcome([("s/good", 1.0), ("s/bad", 0.5)], ["s"], 0.1)
    outcomes = {"rrf": {q.query_id: perfect for q in queries}, "loo/gold": {"s/q0": perfect, "s/q1": perfect}}
    evaluation = Evaluation(bench, queries, qrels, {q.query_id: ["s"] for q in queries}, outcomes, {}, {}, {}, [])
    rows = {row["method"]: row for row in _rows(evaluation, ["rrf", "loo/gold"], [q.query_id for q in queries])}
    assert rows["loo/gold"]["queries"] == 2 and rows["loo/gold"]["ndcg@10"]["mean"] == 1.0
    assert rows["rrf"]["queries"] == 4 and rows["rrf"]["source_recall"] == 1.0


def test_a_run_is_judged_as_trec_eval_judges_its_file_with_copies_of_one_text_kept(tmp_path):
    """Copies of one passage under two ids (MS MARCO has many) are merged for the user, not for the score."""
    from ranx import Qrels, Run, evaluate

    from gradfuse.candidate import Candidate
    from gradfuse.eval.benchmark import Benchmark
    from gradfuse.eval.runner import outcome_of
    from gradfuse.federation.federated import FederatedResult

    texts = ["a passage about moons", "a passage about rings", "a passage about moons", "a passage about dust"]
    run = [Candidate("bm25", f"d{i}", text, 10.0 - i, i + 1) for i, text in enumerate(texts)]
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    result = ws.rank("moons", FederatedResult({"bm25": run}), method="single:bm25", k=4)
    assert len(result.candidates) == 3 and result.candidates[0].merged[0].doc_id == "d2"  # the user sees one copy
    bench = Benchmark(name="b", file=tmp_path / "b.toml", data=tmp_path, workspace=tmp_path / "ws", sources={},
                      query_sets={}, methods=[], metrics=["ndcg@10"], shared_collection=True)
    judged = outcome_of(bench, result).ranking
    assert [key for key, _ in judged] == ["d0", "d1", "d2", "d3"]  # the run's own order, every id kept
    qrels = Qrels({"q": {"d2": 1, "d3": 1}})
    ours = evaluate(qrels, Run({"q": dict(judged)}), "ndcg@10")
    as_filed = evaluate(qrels, Run({"q": {c.doc_id: c.native_score for c in run}}), "ndcg@10")
    assert ours == pytest.approx(as_filed)
    fused = outcome_of(bench, ws.rank("moons", FederatedResult({"bm25": run}), method="rrf", k=4)).ranking
    assert {key for key, _ in fused} == {"d0", "d1", "d2", "d3"}  # fusion keeps the copy, after its primary


def test_run_files_keep_ids_with_spaces_as_one_field_and_read_back_exactly(tmp_path):
    """HotpotQA's ids hold spaces ("Mākaha, Hawaii"): written as they were, trec_eval read seven fields."""
    from types import SimpleNamespace

    from gradfuse.eval.report import _write_runs
    from gradfuse.sources.run import read_trec_run

    ranking = [("Mākaha, Hawaii", 2.5), ("100% pure\tcotton", 1.5), ("plain-id", 0.5)]
    evaluation = SimpleNamespace(split=lambda name: [SimpleNamespace(query_id="q 1")],
                                 outcomes={"gro/query": {"q 1": SimpleNamespace(ranking=ranking)}})
    _write_runs(evaluation, tmp_path)
    lines = (tmp_path / "gro-query.trec").read_text().splitlines()
    assert len(lines) == 3 and all(len(line.split()) == 6 for line in lines)
    assert [(q, d) for q, d, _, _ in read_trec_run(tmp_path / "gro-query.trec")] == [("q 1", d) for d, _ in ranking]


@needs_data
def test_a_run_stopped_half_way_leaves_what_it_measured(tmp_path):
    from gradfuse.eval import run_benchmark
    from gradfuse.eval.report import write_partial

    bench = load_benchmark(BENCHMARKS / "dl19.toml", quick=True)
    bench.methods = ["rrf", "upr"]  # the cheap row, then one scoring-LM method

    class Stopped(Exception):
        pass

    def checkpoint(so_far):
        write_partial(so_far, tmp_path, "gradfuse eval dl19.toml --quick")
        raise Stopped  # as a run killed after its cheap methods

    with pytest.raises(Stopped):
        run_benchmark(bench, progress=False, checkpoint=checkpoint)
    partial = json.loads((tmp_path / "results.json").read_text())
    assert partial["finished"] is False and partial["commit"] and partial["machine"]
    assert [row["method"] for row in partial["tables"][0]["rows"]] == ["rrf"]


def test_soft_selection_is_tuned_on_dev_over_stage_1s_settings_and_ties_keep_the_smaller_weight():
    from gradfuse.eval.outcome import Outcome
    from gradfuse.eval.tuning import soft_selection_settings
    from gradfuse.selection import SelectionSettings

    qrels = {"q1": {"right": 1}, "q2": {"right": 1}}
    seen = []

    def rank_soft(query_id, settings):
        seen.append(settings)
        first = "right" if settings.soft_weight >= 0.25 and settings.soft_margin == 0.2 else "wrong"
        return Outcome([(first, 2.0), ("other", 1.0)], [], None)

    base = SelectionSettings(redundancy="similarity", fusion="rrf")
    chosen, grid = soft_selection_settings(qrels, ["q1", "q2"], rank_soft, base, "ndcg@10")
    assert (chosen.choice, chosen.soft_weight, chosen.soft_margin) == ("soft", 0.25, 0.2)  # 0.5 and 1.0 tie it
    assert chosen.redundancy == "similarity" and chosen.fusion == "rrf"  # stage 1's tuned settings kept
    assert all(s.choice == "soft" for s in seen) and len(grid) == len({(p["soft_weight"], p["soft_margin"]) for p in grid})
    assert max(p["ndcg@10"] for p in grid) == 1.0 and min(p["ndcg@10"] for p in grid) == 0.0
