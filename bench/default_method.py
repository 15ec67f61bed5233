"""The default method, chosen by a stated rule from the committed benchmark results (`make bench-default`, after the
benchmarks it reads).

Rule: among the methods whose answer takes at most LATENCY_BUDGET seconds (p50, warm, on this 2-core machine, in
the answer benchmark), the default is the one with the best mean rank over the benchmarks' headline metrics on
their test questions: federated nDCG@10, QA answer@5, DL19 nDCG@10 and the answer benchmark's quoted answer correct
(hit@1 breaks a tie). Methods over the budget are listed beside, with what they would add.

Reads results/fusion/{federated,qa}/results.json (the uniform and stage-1 methods after the RRF fix, over all test
queries), results/dl19/results.json and results/answers/results.json; writes results/defaults/method.{md,json}.

    python bench/default_method.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gradfuse.eval.record import ResultsFile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
OUT = RESULTS / "defaults" / "method.md"
LATENCY_BUDGET = 1.0  # seconds an answer may take, p50 (warm, two cores)
BENCHMARKS = {  # name → (results file, table, metric)
    "federated nDCG@10": ("fusion/federated/results.json", "all test queries", "ndcg@10"),
    "QA answer@5": ("fusion/qa/results.json", "all test queries", "answer@5"),
    "DL19 nDCG@10": ("dl19/results.json", "all test queries", "ndcg@10"),
}


def benchmark_scores() -> dict[str, dict[str, float]]:
    scores = {}
    for name, (file, table, metric) in BENCHMARKS.items():
        tables = json.loads((RESULTS / file).read_text())["tables"]
        rows = next(t for t in tables if t["name"] == table)["rows"]
        scores[name] = {row["method"]: row[metric]["mean"] for row in rows if metric in row}
    return scores


def lm_subsamples() -> dict[str, tuple[float, float]]:
    """Each ranking benchmark's headline metric for `upr` and `select` on its scoring-LM subsample (committed runs)."""
    out = {}
    for name, (file, _, metric) in BENCHMARKS.items():
        tables = json.loads((RESULTS / file.removeprefix("fusion/")).read_text())["tables"]
        rows = {r["method"]: r for r in next(t for t in tables if t["name"].startswith("scoring-LM subsample"))["rows"]}
        out[name] = (rows["upr"][metric]["mean"], rows["select"][metric]["mean"])
    return out


def main() -> None:
    answers = json.loads((RESULTS / "answers" / "results.json").read_text())
    scores = benchmark_scores()
    scores["answers: quoted answer correct"] = {m: r["quoted"] for m, r in answers["rows"].items()}
    hit = {m: r["hit@1"] for m, r in answers["rows"].items()}
    latency = {m: r["seconds p50"] for m, r in answers["rows"].items()}
    methods = [m for m in answers["rows"] if all(m in s for s in scores.values())]
    ranks = {m: [] for m in methods}
    for values in scores.values():
        order = sorted(methods, key=lambda m: -values[m])
        for m in methods:
            ranks[m].append(1 + sum(values[o] > values[m] for o in order))
    within = [m for m in methods if latency[m] <= LATENCY_BUDGET]
    chosen = min(within, key=lambda m: (np.mean(ranks[m]), -hit[m]))
    results = ResultsFile.start(OUT.parent, "make bench-default", name=OUT.stem, latency_budget_s=LATENCY_BUDGET,
                                benchmarks=list(scores))
    for m in sorted(methods, key=lambda m: np.mean(ranks[m])):
        results.add(m, {**{name: s[m] for name, s in scores.items()}, "answers hit@1": hit[m],
                        "mean rank": float(np.mean(ranks[m])), "seconds p50": latency[m]})
    over = {m: {"seconds p50": latency[m], "quoted": answers["rows"][m]["quoted"], "hit@1": hit[m]}
            for m in answers["rows"] if latency[m] > LATENCY_BUDGET}
    results.finish(markdown(results, chosen, over), chosen=chosen, over_budget=over,
                   lm_subsamples={name: {"upr": upr, "select": select} for name, (upr, select) in lm_subsamples().items()})
    print((OUT.parent / f"{OUT.stem}.md").read_text())


def markdown(results: ResultsFile, chosen: str, over: dict) -> str:
    names = results.header["benchmarks"]
    lines = ["# The default method", "", f"{results.provenance} From the committed results. The rule: among the methods "
             "whose answer takes at most "
             f"{LATENCY_BUDGET:g} s (p50, warm, two cores, in the answer benchmark), the one with the best mean rank "
             "over the benchmarks' headline metrics on their test questions; hit@1 on the answer benchmark breaks a "
             "tie. The federated and QA rows are the uniform and stage-1 methods rerun after the RRF fix "
             "(results/fusion/), over every test query.", "",
             "| method | " + " | ".join(names) + " | answers hit@1 | mean rank | s / answer |",
             "|---|" + "---:|" * (len(names) + 3)]
    for m, row in results.rows.items():
        name = f"**`{m}`** (the default)" if m == chosen else f"`{m}`"
        lines.append(f"| {name} | " + " | ".join(f"{row[n]:.3f}" for n in names)
                     + f" | {row['answers hit@1']:.2f} | {row['mean rank']:.2f} | {row['seconds p50']:.2f} |")
    lines += ["", "Over the latency budget: " + "; ".join(
        f"`{m}` {r['seconds p50']:.1f} s an answer (answer benchmark: quoted {r['quoted']:.2f}, hit@1 "
        f"{r['hit@1']:.2f})" for m, r in over.items()) + ". On the ranking benchmarks' scoring-LM subsamples, stage 1 "
        "with UPR (`upr`, what `gro` runs with its default signal) against `select` on the same queries: "
        + "; ".join(f"{name} {upr:.3f} against {select:.3f}" for name, (upr, select) in lm_subsamples().items()) + ".",
        "", f"**The default is `{chosen}`** (`[defaults] method`, the CLI, the HTTP API, the page and the framework "
        "retrievers)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
