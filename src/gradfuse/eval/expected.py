"""Expected scores stored next to a benchmark's command (as Pyserini's 2CR does), so that a change which moves a
score cannot land silently: `gradfuse eval BENCH.toml --quick --check` fails beyond each score's tolerance.

A quick variant averages over a handful of queries, so one near-tied pair that swaps on another CPU moves a mean by
a fixed step divided by the query count. Each score's tolerance is that step: what one swapped pair on one query can
change, and never under MIN_TOLERANCE. Quick variants also run the encoder and scorer in float32 (bf16 kernels differ
between CPUs of one kind), so swaps stay rare; a real change of the method moves several queries at once.
"""

from __future__ import annotations

import json
from pathlib import Path

MIN_TOLERANCE = 0.02
# metric family → how far one swapped adjacent pair on one query can move its value:
# MRR 1 → 1/2; nDCG 1 − 1/log2(3) of the ideal DCG at most; a recall, answer or NLL@k moves by at most one query's
# whole value when a document crosses the cutoff (taken as 1).
SWAP_STEP = {"mrr": 0.5, "ndcg": 0.37}
DEFAULT_STEP = 1.0


def expected_path(bench_file: Path, quick: bool) -> Path:
    return bench_file.with_name(f"{bench_file.stem}{'.quick' if quick else ''}.expected.json")


def tolerance(metric: str, queries: int) -> float:
    step = SWAP_STEP.get(metric.split("@", 1)[0], DEFAULT_STEP)
    return round(max(MIN_TOLERANCE, step / max(queries, 1)), 4)


def expected_scores(summary: dict) -> dict[str, dict[str, dict]]:
    """table name → "method metric" → {mean, queries, tolerance}, from a results summary."""
    return {table["name"]: {f"{row['method']} {metric}": {"mean": value["mean"], "queries": value["queries"],
                                                          "tolerance": tolerance(metric, value["queries"])}
                            for row in table["rows"]
                            for metric, value in row.items() if isinstance(value, dict) and "ci95" in value}
            for table in summary["tables"]}


def write_expected(path: Path, summary: dict) -> None:
    payload = {"command": summary["command"], "commit": summary["commit"], "scores": expected_scores(summary)}
    path.write_text(json.dumps(payload, indent=1) + "\n")


def check_expected(path: Path, summary: dict) -> list[str]:
    """Every score that moved beyond its tolerance, or is missing, as a readable line; empty when all match."""
    if not path.is_file():
        return [f"no expected scores at {path} (write them with --update-expected)"]
    expected = json.loads(path.read_text())
    actual = expected_scores(summary)
    problems = []
    for table, scores in expected["scores"].items():
        for name, stored in scores.items():
            got = actual.get(table, {}).get(name)
            if got is None:
                problems.append(f"{table}: {name} expected {stored['mean']:.4f}, not produced")
            elif abs(got["mean"] - stored["mean"]) > stored["tolerance"]:
                problems.append(f"{table}: {name} expected {stored['mean']:.4f} ± {stored['tolerance']}, "
                                f"got {got['mean']:.4f}")
    return problems
