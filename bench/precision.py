"""Does the scoring LM keep its quality in bfloat16? Each benchmark's LM rows (its own samples, its own harness and
dev tuning) run twice, with `[lm] dtype` float32 and bfloat16, on the same queries: the headline metric of both,
a paired randomisation test, and how far the two precisions agree on each query's pool (Spearman of the scores,
the same first passage) and what the passes cost.

    python bench/precision.py                      # UPR (gro's default signal) on federated, QA and DL19
    python bench/precision.py --methods upr gro/query --benchmarks dl19

Writes results/latency/precision.md and precision.json. Times are the LM's ranking seconds per query as the
harness records them (an idle machine is needed for them to mean anything; the quality columns are what counts).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from gradfuse.eval import load_benchmark
from gradfuse.eval.record import ResultsFile
from gradfuse.eval.runner import run_benchmark
from gradfuse.eval.stats import paired_difference, per_query
from gradfuse.rerank.precision import resolve_dtype

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "latency"
PRECISIONS = ("float32", "bfloat16")


def run_precisions(name: str, methods: list[str], quick: bool = False) -> dict[str, dict]:
    """method → {precision: ({query id: outcome}, evaluation)} over the benchmark's LM test subsample."""
    bench = load_benchmark(ROOT / "benchmarks" / f"{name}.toml", quick=quick)
    runs: dict[str, dict] = {m: {} for m in methods}
    for precision in PRECISIONS:
        evaluation = run_benchmark(replace(bench, methods=methods,
                                           lm_options={**bench.lm_options, "dtype": precision}))
        test = [q.query_id for q in evaluation.split("test", lm=True)]
        for method in methods:
            outcomes = {q: o for q, o in evaluation.outcomes.get(method, {}).items() if q in test}
            runs[method][precision] = (outcomes, evaluation)
    return runs


def agreement(a, b) -> tuple[float | None, bool]:
    """Spearman of two runs' scores over the same pool (None where the pools differ), and the same first passage."""
    score_a = {row["key"]: row[a.score_key] for row in a.head}
    score_b = {row["key"]: row[b.score_key] for row in b.head}
    same_first = bool(a.ranking and b.ranking and a.ranking[0][0] == b.ranking[0][0])
    if set(score_a) != set(score_b) or len(score_a) < 2:
        return None, same_first
    keys = sorted(score_a)
    rho = spearmanr([score_a[k] for k in keys], [score_b[k] for k in keys]).statistic
    return float(rho), same_first


def metric_values(evaluation, method: str, outcomes: dict, metric: str) -> dict[str, float]:
    """Query id → value: an answer-level metric (answer@k) as the QA harness computed it, else ranx's."""
    answered = evaluation.extra.get(method, {}).get(metric)
    if answered is not None:
        return {q: v for q, v in answered.items() if q in outcomes and v is not None}
    return per_query(evaluation.qrels, outcomes, sorted(outcomes), [metric])[metric]


def compare(name: str, method: str, by_precision: dict) -> dict:
    (fp32, evaluation), (bf16, _) = by_precision["float32"], by_precision["bfloat16"]
    metric = evaluation.bench.headline_metric
    a = metric_values(evaluation, method, fp32, metric)
    b = metric_values(by_precision["bfloat16"][1], method, bf16, metric)
    ids = sorted(set(a) & set(b))
    x, y = np.array([a[q] for q in ids]), np.array([b[q] for q in ids])
    agreements = [agreement(fp32[q], bf16[q]) for q in ids]
    rhos = [rho for rho, _ in agreements if rho is not None]
    seconds = {p: [o.seconds for o in outcomes.values() if o.seconds is not None]
               for p, (outcomes, _) in by_precision.items()}
    return {
        "benchmark": name, "method": method, "metric": metric, "queries": len(ids),
        "float32": float(x.mean()), "bfloat16": float(y.mean()), **paired_difference(y, x),
        "spearman_mean": float(np.mean(rhos)) if rhos else None, "spearman_min": float(np.min(rhos)) if rhos else None,
        "same_pool": len(rhos), "same_first": float(np.mean([same for _, same in agreements])),
        "seconds_float32": float(np.median(seconds["float32"])) if seconds["float32"] else None,
        "seconds_bfloat16": float(np.median(seconds["bfloat16"])) if seconds["bfloat16"] else None,
    }


def this_machine(results: ResultsFile) -> str:
    return f"{results.header['machine']} (auto → {resolve_dtype('auto')})"


def kept_rows(rerun: set[tuple[str, str]]) -> dict[str, dict]:
    """The earlier runs' rows that are not run again now, each with the commit and machine that made it."""
    path = OUT / "precision.json"
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())["rows"]
    rows = rows.values() if isinstance(rows, dict) else rows  # a list in files written before ResultsFile
    return {row_name(r["benchmark"], r["method"]): r for r in rows if (r["benchmark"], r["method"]) not in rerun}


def row_name(benchmark: str, method: str) -> str:
    return f"{benchmark} {method}"


def markdown(results: ResultsFile) -> str:
    rows = list(results.rows.values())
    machines = sorted({r["machine"] for r in rows})
    lines = [
        "# The scoring LM in bfloat16 against float32",
        "",
        f"{results.provenance} A benchmark alone: `--benchmarks NAME --methods M`, which replaces those rows; the "
        f"others are kept from earlier runs · commits: {', '.join(sorted({r['commit'] for r in rows}))} · "
        "machines (column m): "
        + "; ".join(f"{number}: {machine}" for number, machine in enumerate(machines, start=1)) + ".",
        "",
        "Each benchmark's LM rows through its own harness (the same LM subsample and dev tuning as its results), "
        "once per precision. Δ: bfloat16 minus float32 on the headline metric, p: paired randomisation test; "
        "Spearman: of the two precisions' scores over the same pool (mean, min, over the queries whose dev tuning "
        "chose the same pool); first: the queries whose first passage is the same; s: median LM ranking seconds "
        "per query.",
        "",
        "| benchmark | method | metric | queries | float32 | bfloat16 | Δ | p | Spearman mean · min | first | s fp32 · bf16 | m |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in rows:
        rho = (f"{r['spearman_mean']:.3f} · {r['spearman_min']:.3f} ({r['same_pool']})"
               if r["spearman_mean"] is not None else "pools differ")
        secs = (f"{r['seconds_float32']:.2f} · {r['seconds_bfloat16']:.2f}"
                if r["seconds_float32"] is not None else "")
        lines.append(f"| {r['benchmark']} | {r['method']} | {r['metric']} | {r['queries']} | {r['float32']:.3f} | "
                     f"{r['bfloat16']:.3f} | {r['delta']:+.3f} | {r['p']:.3g} | {rho} | {r['same_first']:.2f} | "
                     f"{secs} | {machines.index(r['machine']) + 1} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["upr"])
    parser.add_argument("--benchmarks", nargs="+", default=["federated", "qa", "dl19"])
    parser.add_argument("--quick", action="store_true", help="the benchmarks' quick variants (a smoke test)")
    args = parser.parse_args()
    # Rows not rerun now are kept (each benchmark and method can be run on its own); a rerun replaces its rows.
    kept = {} if args.quick else kept_rows({(b, m) for b in args.benchmarks for m in args.methods})
    results = ResultsFile.start(OUT, " ".join(["python bench/precision.py", *sys.argv[1:]]), name="precision",
                                benchmarks=args.benchmarks, methods=args.methods, quick=args.quick)
    for name, row in kept.items():
        results.add(name, row)
    for name in args.benchmarks:
        for method, by_precision in run_precisions(name, args.methods, args.quick).items():
            row = {**compare(name, method, by_precision), "commit": results.header["commit"],
                   "machine": this_machine(results)}
            results.add(row_name(name, method), row)
            print(json.dumps(row), flush=True)
    results.finish(markdown(results))


if __name__ == "__main__":
    main()
