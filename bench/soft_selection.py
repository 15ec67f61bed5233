"""Soft selection against hard selection and against cosine over every source's candidates (issue 60, item 5).

`select` with `[selection] choice = "hard"` (the default: the sources stage 1 chooses are kept, the others dropped)
against `choice = "soft"` (every source ordered by the same greedy gain; a passage's cosine lowered by `soft_weight`
times how far its source's gain stands below the best; a source dropped only more than `soft_margin` below the
best) and against `dense` (cosine over every source's candidates, the strongest cheap baseline), on four sets:
the federated, QA and DL19 benchmark files' queries, and "arguana+scifact": the federated file's nine sources asked
only ArguAna's and SciFact's own queries, 200 test queries of each (the federated file's 100 test ones and the
next 100 after its dev ones) with its 30 dev ones of each.

The soft weight and margin are chosen on the dev queries of three sets at once (the mean of the sets' dev
nDCG@10; DL19 has no dev queries, its 43 are all held out here), then every way ranks the same candidates of each
test query; paired randomisation tests.

Run: make bench-soft-selection (results/stage1/soft.{md,json}; about 30 min on two cores once the benchmark
sources are built).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from itertools import product
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from gradfuse.eval import load_benchmark  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.eval.runner import benchmark_workspace, outcome_of, queries_and_qrels  # noqa: E402
from gradfuse.eval.stats import mean_interval, paired_difference, per_query  # noqa: E402
from gradfuse.selection import SelectionSettings  # noqa: E402

SETS = ("federated", "qa", "dl19", "arguana+scifact")
DEV_SETS = ("federated", "qa", "arguana+scifact")  # DL19's 43 queries are cross-fitted there, none is dev: held out
MIXED = ("arguana", "scifact")
WEIGHTS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
MARGINS = (0.05, 0.1, 0.2, 2.0)  # 2.0: no source dropped
METRIC = "ndcg@10"
OUT = ROOT / "results" / "stage1"


def benchmark_of(name: str):
    """The set's benchmark and its queries (each with its split) and judgements."""
    if name != "arguana+scifact":
        bench = load_benchmark(ROOT / "benchmarks" / f"{name}.toml")
        return (bench, *queries_and_qrels(bench)[:2])
    federated = load_benchmark(ROOT / "benchmarks" / "federated.toml")
    first, dev = federated.sample, federated.dev
    # the same seeded order as the federated file: its test queries, its dev ones, then 100 more as test
    bench = replace(federated, query_sets={s: federated.query_sets[s] for s in MIXED}, sample=2 * first + dev, dev=0)
    queries, qrels, _ = queries_and_qrels(bench)
    queries = [replace(q, split="dev" if first <= q.position < first + dev else "test") for q in queries]
    return bench, queries, qrels


def soft(weight: float, margin: float) -> SelectionSettings:
    return SelectionSettings(choice="soft", soft_weight=weight, soft_margin=margin)


def rank_all(name: str, ways: dict[str, tuple[str, SelectionSettings | None]], split: str) -> dict:
    """Per way, per query of `split`: nDCG@10, and the sources its ranking drew on."""
    bench, queries, qrels = benchmark_of(name)
    ws = benchmark_workspace(bench)
    for source, spec in bench.sources.items():
        if source not in bench.engines:
            ws.index(spec, progress=False)
    chosen = [q for q in queries if q.split == split]
    outcomes: dict[str, dict] = {way: {} for way in ways}
    for number, query in enumerate(chosen, start=1):
        federated = ws.retrieve(query.text, sources=bench.source_names, depth=bench.depth)
        for way, (method, settings) in ways.items():
            result = ws.rank(query.text, federated.copy(), method=method, k=bench.k, selection=settings)
            outcomes[way][query.query_id] = outcome_of(bench, result)
        if number % 100 == 0:
            print(f"{name} {split}: {number}/{len(chosen)}", file=sys.stderr, flush=True)
    ws.close()
    ids = [q.query_id for q in chosen]
    return {way: {"values": [per_query(qrels, outcomes[way], ids, [METRIC])[METRIC][q] for q in ids],
                  "sources": [len(outcomes[way][q].chosen) for q in ids]} for way in ways}


def grid_way(weight: float, margin: float) -> str:
    return f"soft, weight {weight:g}, margin {margin:g}"


def baselines() -> dict[str, tuple[str, SelectionSettings | None]]:
    return {"dense over every source": ("dense", None), "select, hard (default)": ("select", SelectionSettings())}


def compare(runs: dict, way: str, against: str) -> dict:
    return paired_difference(runs[way]["values"], runs[against]["values"])


def summary(runs: dict) -> dict:
    return {way: {**mean_interval(run["values"]), "sources": round(float(np.mean(run["sources"])), 2)}
            for way, run in runs.items()}


def markdown(results: ResultsFile) -> str:
    chosen = results.header["chosen"]
    lines = ["# Soft selection, hard selection and cosine over every source", "",
             f"{results.provenance} bench/soft_selection.py's docstring says how. Soft's weight and margin chosen on "
             f"the dev queries of {', '.join(DEV_SETS)} at once: weight {chosen['weight']:g}, "
             f"margin {chosen['margin']:g} "             f"(mean dev {METRIC} {chosen['dev']:.4f}). Test queries, {METRIC} (sources its ranking drew on); "
             "Δ with the paired randomisation test's p.", "",
             "| set | queries | dense over every source | select, hard (default) | select, soft | soft − dense (p) "
             "| soft − hard (p) | hard − dense (p) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in SETS:
        row = results.rows.get(f"{name} test")
        if row is None:
            continue
        cells = [f"{row[w]['mean']:.4f} ({row[w]['sources']:g})" for w in ("dense over every source",
                                                                           "select, hard (default)", "select, soft")]
        pairs = [f"{row[k]['delta']:+.4f} ({row[k]['p']:.3g})" for k in ("soft vs dense", "soft vs hard",
                                                                          "hard vs dense")]
        lines.append(f"| {name} | {row['queries']} | " + " | ".join(cells + pairs) + " |")
    lines += ["", f"Dev {METRIC} by weight and margin (mean of the three sets' dev means; each set's in the JSON):", "",
              "| weight \\ margin | " + " | ".join(f"{m:g}" for m in MARGINS) + " |",
              "|---|" + "---:|" * len(MARGINS)]
    grid = results.header["dev grid"]
    for weight in WEIGHTS:
        lines.append(f"| {weight:g} | " + " | ".join(f"{grid[grid_way(weight, m)]['mean']:.4f}" for m in MARGINS)
                     + " |")
    base = results.header["dev baselines"]
    lines += ["", "Dev, for reference: " + ", ".join(f"{way} {value:.4f}" for way, value in base.items()) + "."]
    return "\n".join(lines)


def main() -> int:
    ways = baselines() | {grid_way(w, m): ("select", soft(w, m)) for w, m in product(WEIGHTS, MARGINS)}
    dev_runs = {name: rank_all(name, ways, "dev") for name in DEV_SETS}
    dev_means = {way: {name: float(np.mean(dev_runs[name][way]["values"])) for name in DEV_SETS} for way in ways}
    pooled = {way: float(np.mean(list(by_set.values()))) for way, by_set in dev_means.items()}
    grid = {way: {"mean": round(pooled[way], 4), **{n: round(v, 4) for n, v in dev_means[way].items()}}
            for way in ways if way.startswith("soft")}
    # ties keep the earlier point: the smaller weight, then the smaller margin
    weight, margin = max(product(WEIGHTS, MARGINS), key=lambda p: (round(pooled[grid_way(*p)], 6),
                                                                   -WEIGHTS.index(p[0]), -MARGINS.index(p[1])))
    chosen = {"weight": weight, "margin": margin, "dev": pooled[grid_way(weight, margin)]}
    results = ResultsFile.start(OUT, "make bench-soft-selection", name="soft", **{
        "chosen": chosen, "dev grid": grid, "dev baselines": {w: round(pooled[w], 4) for w in baselines()}})
    test_ways = baselines() | {"select, soft": ("select", soft(weight, margin))}
    for name in SETS:
        runs = rank_all(name, test_ways, "test")
        row = {"queries": len(runs["select, soft"]["values"]), **summary(runs),
               "soft vs dense": compare(runs, "select, soft", "dense over every source"),
               "soft vs hard": compare(runs, "select, soft", "select, hard (default)"),
               "hard vs dense": compare(runs, "select, hard (default)", "dense over every source")}
        results.add(f"{name} test", row)
        print(name, json.dumps(row), flush=True)
    results.finish(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
