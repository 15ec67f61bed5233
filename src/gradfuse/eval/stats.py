"""Per-query metric values (from ranx), bootstrap confidence intervals and paired randomisation tests (scipy)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from ranx import evaluate
from scipy import stats

from gradfuse.eval.tuning import as_qrels, as_run

RESAMPLES = 5000


@dataclass
class Estimate:
    mean: float
    low: float  # 95% bootstrap percentile interval
    high: float

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def per_query(qrels, outcomes: dict, query_ids: list[str], metrics: list[str]) -> dict[str, dict[str, float]]:
    """metric → query id → value, computed by ranx. `complete@k` (complete evidence): 1 where every relevant
    document of the query is in the top k (ranx's recall@k is 1), else 0; for multi-hop questions, whether the
    context holds the whole chain."""
    judged = as_qrels(qrels, query_ids)
    wanted = list(dict.fromkeys(_ranx_metric(m) for m in metrics))
    with warnings.catch_warnings():  # numba's integer-cast warning
        warnings.simplefilter("ignore")
        values = evaluate(judged, as_run(outcomes, query_ids), wanted, return_mean=False, make_comparable=True)
    if len(wanted) == 1:
        values = {wanted[0]: values}
    order = list(judged.keys())
    result = {}
    for metric in metrics:
        column = (float(v) for v in values[_ranx_metric(metric)])
        if metric.startswith(COMPLETE):
            column = (float(v >= 1.0 - 1e-9) for v in column)
        result[metric] = dict(zip(order, column))
    return result


COMPLETE = "complete@"


def _ranx_metric(metric: str) -> str:
    return metric.replace(COMPLETE, "recall@", 1) if metric.startswith(COMPLETE) else metric


def estimate(values: np.ndarray) -> Estimate:
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return Estimate(float("nan"), float("nan"), float("nan"))
    if len(values) < 2 or np.ptp(values) == 0:  # nothing to resample
        return Estimate(float(values.mean()), float(values.mean()), float(values.mean()))
    interval = stats.bootstrap((values,), np.mean, n_resamples=RESAMPLES, method="percentile",
                               random_state=0).confidence_interval
    return Estimate(float(values.mean()), float(interval.low), float(interval.high))


def mean_interval(values) -> dict:
    """A mean with its 95% interval, as every results file records it."""
    e = estimate(values)
    return {"mean": round(e.mean, 4), "ci95": [round(e.low, 4), round(e.high, 4)]}


def paired_difference(a, b) -> dict:
    """mean(a) − mean(b) over the same queries, with the paired randomisation test's p, as results files record it."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return {"delta": round(float(a.mean() - b.mean()), 4), "p": round(paired_p_value(a, b), 4)}


def paired_p_value(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired randomisation test of mean(a - b) = 0 (swapping each query's pair of values)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or np.allclose(a, b):
        return 1.0
    result = stats.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                                    permutation_type="samples", n_resamples=RESAMPLES, random_state=0)
    return float(result.pvalue)
