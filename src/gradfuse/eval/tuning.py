"""Everything a benchmark tunes, tuned on dev queries only and scored by ranx (the benchmark's tuning metric).

- the best static source: the single source with the highest dev nDCG@10;
- learned fusion: per-source weights from ranx's `optimize_fusion` (weighted CombSUM over normalised scores);
- stage 1: redundancy weight lambda, gain threshold, source limit and select's fusion, by grid search (replaying the greedy choice
  on each dev query's stored relevance/redundancy values, so no query is re-embedded);
- stage 2: the pool, the prior and how the score mixes with it (z-sum weight, or reordering within the prior's
  top m), on the LM subsample's dev queries.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from functools import lru_cache
from dataclasses import replace
from itertools import product

import numpy as np
from ranx import Qrels, Run, evaluate, fuse, optimize_fusion

from gradfuse.eval.outcome import Outcome
from gradfuse.rerank.base import combine
from gradfuse.selection import SELECT_FUSIONS, SelectionSettings, choose_sources

REDUNDANCY_WEIGHTS = (0.0, 0.25, 0.5, 1.0)
THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
MAX_SOURCES = (1, 2, 3, 99)  # 99: no limit (complementary sources, such as several runs of one collection)
PRIOR_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
WITHIN_M = (1, 2, 3, 5)  # mix "within": how many of the prior's first candidates the score may reorder
SOFT_WEIGHTS = (0.0, 0.1, 0.25, 0.5, 1.0)  # bench/soft_selection.py's grid, less the weights that lost everywhere
SOFT_MARGINS = (0.1, 0.2, 2.0)  # 2.0: no source dropped


@lru_cache(maxsize=None)
def _plain(key: str) -> str:
    """A short ASCII stand-in for a document key. ranx's numba code turns qrels into typed lists on every evaluate
    call, and with DBpedia's mixed-width Unicode ids that took 1.5 s for 192 dev queries (0.003 s with ASCII ids),
    which made weight optimisation take half an hour."""
    return hashlib.blake2b(key.encode(), digest_size=10).hexdigest()


def as_run(outcomes: dict, query_ids: list[str], *, scores: bool = False) -> Run:
    """ranx needs every query present; a query a method answered with nothing gets an empty ranking. Document
    keys become ASCII stand-ins (see `_plain`), as in `as_qrels`. To be judged, a ranking goes in as its positions:
    ranx would re-sort equal scores its own way, and the order a method returned is the one it is judged on.
    Fusion (`scores=True`) needs the scores themselves."""
    def values(ranking):
        return ((k, s) for k, s in ranking) if scores else ((k, len(ranking) - i) for i, (k, _) in enumerate(ranking))

    return Run({q: {_plain(k): v for k, v in values(outcomes[q].ranking)} if q in outcomes else {} for q in query_ids})


def as_qrels(qrels: dict[str, dict[str, int]], query_ids: list[str]) -> Qrels:
    return Qrels({q: {_plain(k): v for k, v in qrels[q].items()} for q in query_ids})


def mean_score(qrels, outcomes, query_ids, metric: str) -> float:
    if not query_ids:
        return float("nan")
    with warnings.catch_warnings():  # numba's integer-cast warning
        warnings.simplefilter("ignore")
        return float(evaluate(as_qrels(qrels, query_ids), as_run(outcomes, query_ids), metric, make_comparable=True))


def need_dev(dev: list[str], what: str) -> None:
    if not dev:
        raise ValueError(f"{what} is tuned on dev queries, and this benchmark has none (raise [split] dev)")


def best_static_source(qrels, singles: dict[str, dict], dev: list[str], metric: str) -> tuple[str, dict]:
    need_dev(dev, "static-best")
    scores = {source: round(mean_score(qrels, outcomes, dev, metric), 4) for source, outcomes in singles.items()}
    return max(scores, key=lambda s: (scores[s], s)), scores


def learned_fusion(qrels, singles: dict[str, dict], dev: list[str], apply_to: list[str], norm: str, step: float,
                   metric: str):
    """Weights optimised by ranx on the dev queries, then fused by ranx for the `apply_to` queries."""
    need_dev(dev, "learned-fusion")
    sources = list(singles)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        params = optimize_fusion(as_qrels(qrels, dev), [as_run(singles[s], dev, scores=True) for s in sources], norm=norm,
                                 method="wsum", metric=metric, step=step, show_progress=False)
        fused = fuse([as_run(singles[s], apply_to, scores=True) for s in sources], norm=norm, method="wsum",
                     params=params).to_dict()
    weights = dict(zip(sources, (float(w) for w in params["weights"])))
    chosen = [s for s in sources if weights[s] > 0]
    outcomes = {}
    original = {_plain(key): key for outcomes in singles.values() for q in apply_to if q in outcomes
                for key, _ in outcomes[q].ranking}
    for query_id in apply_to:
        ranking = sorted(fused[query_id].items(), key=lambda item: -item[1]) if query_id in fused else []
        outcomes[query_id] = Outcome([(original[key], float(score)) for key, score in ranking], chosen, None)
    return weights, outcomes


def selection_settings(
    qrels, profiles: dict[str, tuple[dict, dict]], dev: list[str], rank_sources: Callable, metric: str
) -> tuple[SelectionSettings, list[dict]]:
    """Grid search of stage 1 and of select's fusion on the dev queries; `rank_sources(query_id, sources, fusion)`
    ranks with those sources."""
    need_dev(dev, "stage 1 (select, gro)")
    grid, best, best_score = [], SelectionSettings(), -1.0
    for fusion, redundancy_weight, threshold, max_sources in product(SELECT_FUSIONS, REDUNDANCY_WEIGHTS, THRESHOLDS,
                                                                     MAX_SOURCES):
        settings = replace(SelectionSettings(), redundancy_weight=redundancy_weight, threshold=threshold,
                           max_sources=max_sources, fusion=fusion)
        outcomes = {}
        for query_id in dev:
            relevance, redundancy = profiles[query_id]
            chosen = tuple(choose_sources(relevance, redundancy, settings).sources)
            outcomes[query_id] = rank_sources(query_id, chosen, fusion)
        score = mean_score(qrels, outcomes, dev, metric)
        grid.append({"fusion": fusion, "redundancy_weight": redundancy_weight, "threshold": threshold,
                     "max_sources": max_sources, metric: round(score, 4)})
        if score > best_score + 1e-12:  # ties keep the earlier, simpler point (smaller lambda, lower threshold)
            best, best_score = settings, score
    return best, grid


def soft_selection_settings(qrels, dev: list[str], rank_soft: Callable, base: SelectionSettings, metric: str
                            ) -> tuple[SelectionSettings, list[dict]]:
    """Grid search of soft selection's weight and margin on the dev queries, over stage 1's tuned `base` (its
    redundancy and fusion); `rank_soft(query_id, settings)` ranks with soft selection."""
    need_dev(dev, "soft selection")
    grid, best, best_score = [], None, -1.0
    for weight, margin in product(SOFT_WEIGHTS, SOFT_MARGINS):
        settings = replace(base, choice="soft", soft_weight=weight, soft_margin=margin)
        score = mean_score(qrels, {query_id: rank_soft(query_id, settings) for query_id in dev}, dev, metric)
        grid.append({"soft_weight": weight, "soft_margin": margin, metric: round(score, 4)})
        if score > best_score + 1e-12:  # ties keep the earlier point: the smaller weight, then margin
            best, best_score = settings, score
    return best, grid


def mix_prior(outcome, score_key: str, prior_key: str, mix: str, value: float):
    """The outcome re-ranked over its scored head by `combine` (mix "zsum" with prior weight `value`, or "within"
    the prior's top `value`); the tail keeps its order."""
    if not outcome.head:
        return outcome
    score = np.array([row[score_key] for row in outcome.head])
    prior = np.array([row[prior_key] for row in outcome.head])
    final = combine(score, prior, mix=mix, prior_weight=value, within_m=int(value))
    order = np.argsort(-final, kind="stable")
    head_keys = [outcome.head[i]["key"] for i in order]
    head = set(head_keys)
    tail = [key for key, _ in outcome.ranking if key not in head]
    keys = head_keys + tail
    ranking = [(key, float(len(keys) - i)) for i, key in enumerate(keys)]
    return replace(outcome, ranking=ranking)


def mix_grid(score_keys: list[str], prior_keys: list[str]) -> list[dict]:
    """Every (score, prior, mix, value) point: the first score alone first, so that ties keep the simplest choice."""
    return [{"score": s, "prior": p, "mix": "zsum", "value": w} for s in score_keys for p in prior_keys
            for w in PRIOR_WEIGHTS] + \
        [{"score": s, "prior": p, "mix": "within", "value": m} for s in score_keys for p in prior_keys
         for m in WITHIN_M]


def best_mix(qrels, outcomes: dict, dev: list[str], score_keys: list[str], prior_keys: list[str], metric: str,
             ) -> tuple[dict, float, list[dict]]:
    """(chosen point, its dev score, every point's dev score) of the score/prior mix on the dev queries; where a
    scorer keeps variants of its score (`score_keys` after the first), the variant is chosen with the mix."""
    dev = [q for q in dev if q in outcomes]
    need_dev(dev, "the score/prior mix")
    grid, best, best_score = [], None, -1.0
    for point in mix_grid(score_keys, prior_keys):
        mixed = {q: mix_prior(outcomes[q], point["score"], point["prior"], point["mix"], point["value"]) for q in dev}
        score = mean_score(qrels, mixed, dev, metric)
        grid.append({**point, metric: round(score, 4)})
        if score > best_score + 1e-12:
            best, best_score = point, score
    return best, best_score, grid
