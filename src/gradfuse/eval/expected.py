"""Expected scores stored next to a benchmark's command (as Pyserini's 2CR does), so that a change which moves a
score cannot land silently: `gradfuse eval BENCH.toml --quick --check` fails beyond the stated tolerance."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_TOLERANCE = 0.02  # absolute, on a mean over a few quick queries: bf16 embeddings can differ slightly by CPU
# and swap two near-tied passages; a real regression moves a score by more.


def expected_path(bench_file: Path, quick: bool) -> Path:
    return bench_file.with_name(f"{bench_file.stem}{'.quick' if quick else ''}.expected.json")


def expected_scores(summary: dict) -> dict[str, dict[str, float]]:
    """table name → "method metric" → mean, from a results summary."""
    return {table["name"]: {f"{row['method']} {metric}": value["mean"] for row in table["rows"]
                            for metric, value in row.items() if isinstance(value, dict) and "ci95" in value}
            for table in summary["tables"]}


def write_expected(path: Path, summary: dict, tolerance: float = DEFAULT_TOLERANCE) -> None:
    payload = {"command": summary["command"], "tolerance": tolerance, "commit": summary["commit"],
               "scores": expected_scores(summary)}
    path.write_text(json.dumps(payload, indent=2) + "\n")


def check_expected(path: Path, summary: dict) -> list[str]:
    """Every score that moved beyond the tolerance, or is missing, as a readable line; empty when all match."""
    if not path.is_file():
        return [f"no expected scores at {path} (write them with --update-expected)"]
    expected = json.loads(path.read_text())
    tolerance, actual = expected["tolerance"], expected_scores(summary)
    problems = []
    for table, scores in expected["scores"].items():
        for name, value in scores.items():
            got = actual.get(table, {}).get(name)
            if got is None:
                problems.append(f"{table}: {name} expected {value:.4f}, not produced")
            elif abs(got - value) > tolerance:
                problems.append(f"{table}: {name} expected {value:.4f} ± {tolerance}, got {got:.4f}")
    return problems
