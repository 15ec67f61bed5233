"""Would redundancy measured as copies cost anything where sources do not copy each other (issue 60)? `select` with
the library's default settings (relevance only) against the same settings with `redundancy = "copies"` at the weight
bench/overlap.py chose on its dev questions, on the test queries of the federated, QA and DL19 benchmarks (their
full files, every query set; DL19's six sources are runs over one corpus) and on the answer benchmark's answerable
test questions (bench/answers.py's nine sources and judging: hit@1 and hit@5), each pair ranking the same candidates.

The rule (docs/method.md): the copies setting becomes the default only if no benchmark loses more than 0.005 of its
headline metric.

Run: make bench-selection-default (results/overlap/default.{md,json}; about 40 min on two cores, most of it
building the federated sources the first time).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from gradfuse.eval import load_benchmark  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.eval.stats import mean_interval, paired_difference  # noqa: E402
from gradfuse.eval.runner import benchmark_workspace, outcome_of, queries_and_qrels  # noqa: E402
from gradfuse.eval.stats import per_query  # noqa: E402
from gradfuse.selection import SelectionSettings  # noqa: E402

BENCHMARKS = ("federated", "qa", "dl19")
OUT = ROOT / "results" / "overlap"
LOSS_ALLOWED = 0.005


def copies_weight() -> float:
    """The weight bench/overlap.py chose on its dev questions for the copies measure."""
    return json.loads((OUT / "results.json").read_text())["tuned"]["lambda"]["copies"]


def compare(name: str, ways: dict[str, SelectionSettings], quick: bool) -> dict:
    bench = load_benchmark(ROOT / "benchmarks" / f"{name}.toml", quick=quick)
    ws = benchmark_workspace(bench)
    for source, spec in bench.sources.items():
        if source not in bench.engines:
            ws.index(spec, progress=False)
    queries, qrels, _ = queries_and_qrels(bench)
    test = [q for q in queries if q.split == "test"]
    outcomes: dict[str, dict] = {way: {} for way in ways}
    for number, query in enumerate(test, start=1):
        federated = ws.retrieve(query.text, sources=bench.source_names, depth=bench.depth)
        for way, settings in ways.items():
            result = ws.rank(query.text, federated.copy(), method="select", k=bench.k, selection=settings)
            outcomes[way][query.query_id] = outcome_of(bench, result)
        if number % 50 == 0:
            print(f"{name}: {number}/{len(test)}", file=sys.stderr, flush=True)
    ws.close()
    ids = [q.query_id for q in test]
    metric = "ndcg@10"  # every file measures it (QA's headline is an answer metric, stage 2's concern)
    values = {way: per_query(qrels, outcomes[way], ids, [metric])[metric] for way in ways}
    return {**paired(metric, {way: [values[way][q] for q in ids] for way in ways}),
            "sources chosen": {way: round(float(np.mean([len(outcomes[way][q].chosen) for q in ids])), 2)
                               for way in ways}}


def compare_answers(ways: dict[str, SelectionSettings]) -> dict:
    """The answer benchmark's answerable test questions: is a passage from the answer's place first (hit@1), or in
    the top 5?"""
    sys.path.insert(0, str(ROOT / "bench"))
    import answers

    ws, questions, _ = answers.build()
    test = [q for q in questions if q.split == "test" and q.answerable]
    hits = {way: {"hit@1": [], "hit@5": []} for way in ways}
    for q in test:
        federated = ws.retrieve(q.text)
        for way, settings in ways.items():
            ranked = ws.rank(q.text, federated.copy(), method="select", k=answers.K, selection=settings).candidates
            found = [answers.holds_answer(q, c) for c in ranked]
            hits[way]["hit@1"].append(float(any(found[:1])))
            hits[way]["hit@5"].append(float(any(found[:5])))
    ws.close()
    return {**paired("hit@1", {way: hits[way]["hit@1"] for way in ways}),
            "hit@5": {way: round(float(np.mean(hits[way]["hit@5"])), 4) for way in ways}}


def paired(metric: str, values: dict[str, list[float]]) -> dict:
    """Each way's mean with its interval, and the second way against the first on the same queries."""
    default, copies = (np.array(v, dtype=float) for v in values.values())
    return {"metric": metric, "queries": len(default), **{way: mean_interval(v) for way, v in values.items()},
            **paired_difference(copies, default), "queries changed": int(np.sum(~np.isclose(copies, default)))}


def markdown(results: ResultsFile, weight: float) -> str:
    lines = ["# The default of stage 1's redundancy, on the ranking benchmarks", "",
             f"{results.provenance} bench/selection_default.py's docstring says how: `select` with the default "
             f"settings (relevance only) against `redundancy = \"copies\"`, λ = {weight:g} (bench/overlap.py's dev "
             "choice), on every test query of each benchmark file, the same candidates for both; paired "
             f"randomisation test. The rule: no benchmark may lose more than {LOSS_ALLOWED}.", "",
             "| benchmark | metric | queries | relevance only | copies | Δ (p) | queries changed | sources chosen |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.rows.items():
        default, copies = (r[way] for way in ("relevance only", "copies"))
        chosen = (f"{r['sources chosen']['relevance only']} → {r['sources chosen']['copies']}"
                  if "sources chosen" in r else "–")
        lines.append(f"| {name} | {r['metric']} | {r['queries']} | {default['mean']:.4f} | {copies['mean']:.4f} | "
                     f"{r['delta']:+.4f} ({r['p']:.3g}) | {r['queries changed']} | {chosen} |")
    holds = all(r["delta"] >= -LOSS_ALLOWED for r in results.rows.values())
    lines += ["", f"Rule {'met' if holds else 'not met'}: the copies setting {'may' if holds else 'may not'} become "
              "the default."]
    return "\n".join(lines)


def main() -> int:
    quick = "--quick" in sys.argv  # the files' small variants, for a look (written under .gradfuse/bench)
    weight = copies_weight()
    ways = {"relevance only": SelectionSettings(),
            "copies": SelectionSettings(redundancy_weight=weight, redundancy="copies")}
    out = ROOT / ".gradfuse" / "bench" / "selection-default-look" if quick else OUT
    results = ResultsFile.start(out, "make bench-selection-default", name="default", copies_weight=weight)
    for name in BENCHMARKS:
        results.add(name, compare(name, ways, quick))
        print(name, json.dumps(results.rows[name]), flush=True)
    if not quick:
        results.add("answers", compare_answers(ways))
        print("answers", json.dumps(results.rows["answers"]), flush=True)
    results.finish(markdown(results, weight))
    return 0


if __name__ == "__main__":
    sys.exit(main())
