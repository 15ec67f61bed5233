"""Paired comparison of methods on any metric, from the TREC runs a benchmark command wrote (`gradfuse eval` writes
one per method to .gradfuse/runs/<bench>/): the same per-query metric values (ranx, `complete@k` as the harness
defines it) and the same paired randomisation test as the results tables, restricted to one query set if asked.

    python bench/paired_runs.py benchmarks/qa.toml --metric complete@2 --set hotpotqa --baseline upr \
        --methods set-upr conditional attention gro-calibrated/draft gro/draft

The runs hold only the queries each method ran on (the scoring-LM subsample for LM methods); a method is compared
with the baseline on the queries both ran.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from gradfuse.eval import load_benchmark
from gradfuse.eval.outcome import Outcome
from gradfuse.eval.runner import queries_and_qrels
from gradfuse.eval.stats import paired_difference, per_query

ROOT = Path(__file__).resolve().parents[1]


def read_run(path: Path) -> dict[str, Outcome]:
    rankings: dict[str, list[tuple[str, float]]] = {}
    for line in open(path, encoding="utf-8"):
        fields = line.split()  # the harness writes document keys as they are, spaces included
        query_id, key, score = fields[0], " ".join(fields[2:-3]), float(fields[-2])
        rankings.setdefault(query_id, []).append((key, score))
    return {q: Outcome(ranking, [], None) for q, ranking in rankings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", type=Path)
    parser.add_argument("--metric", required=True)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--methods", nargs="+", required=True)
    parser.add_argument("--set", dest="query_set", default=None, help="only this query set's queries")
    parser.add_argument("--runs", type=Path, default=None, help="default: .gradfuse/runs/<benchmark name>")
    args = parser.parse_args()
    print(f"| method | queries | {args.metric} | {args.baseline} | Δ | p |\n|---|---:|---:|---:|---:|---:|")
    for row in paired(args.benchmark, args.metric, args.baseline, args.methods, args.query_set, args.runs):
        print(f"| {row['method']} | {row['queries']} | {row['mean']:.3f} | {row['baseline']:.3f} | "
              f"{row['delta']:+.3f} | {row['p']:.3g} |")


def paired(benchmark: Path, metric: str, baseline: str, methods: list[str], query_set: str | None = None,
           runs: Path | None = None) -> list[dict]:
    """Each method against the baseline on the queries both ran: their means, the difference and its p."""
    bench = load_benchmark(benchmark)
    _, qrels, _ = queries_and_qrels(bench)
    runs = runs or ROOT / ".gradfuse" / "runs" / bench.name

    def values(method: str) -> dict[str, float]:
        outcomes = read_run(runs / f"{method.replace('/', '-').replace(':', '-')}.trec")
        ids = [q for q in outcomes if query_set is None or q.startswith(f"{query_set}/")]
        return per_query(qrels, outcomes, ids, [metric])[metric]

    base, rows = values(baseline), []
    for method in methods:
        own = values(method)
        shared = [q for q in own if q in base]
        a, b = np.array([own[q] for q in shared]), np.array([base[q] for q in shared])
        rows.append({"method": method, "queries": len(shared), "mean": a.mean(), "baseline": b.mean(),
                     **paired_difference(a, b)})
    return rows


if __name__ == "__main__":
    main()
