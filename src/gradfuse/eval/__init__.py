"""The evaluation harness: `gradfuse eval BENCH.toml` runs every method of a benchmark file on the same
retrieved candidates and writes results/<bench>/ (results.md, results.json, TREC runs, plots)."""

from gradfuse.eval.benchmark import Benchmark, EvalQuery, load_benchmark
from gradfuse.eval.expected import check_expected, expected_scores
from gradfuse.eval.report import write_results
from gradfuse.eval.runner import Evaluation, run_benchmark

__all__ = [
    "Benchmark",
    "EvalQuery",
    "Evaluation",
    "check_expected",
    "expected_scores",
    "load_benchmark",
    "run_benchmark",
    "write_results",
]
