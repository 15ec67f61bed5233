"""Every ranking method by name, over one federated result: the uniform baselines and the per-query method.

- concat, rrf, combsum[-z], combmnz[-z], single:<source>: uniform fusion (`gradfuse.fusion`);
- dense: all sources' candidates pooled, deduplicated and ranked by encoder cosine to the query (the prior);
- select: stage 1 (`gradfuse.selection`) chooses the sources, then RRF over them;
- gradient: stage 2 (`gradfuse.rerank`) over the pooled candidates of every source;
- gro: stage 1, then stage 2 over the chosen sources' candidates (the full method);
- loo, loo-greedy: exact leave-one-out and greedy loss-minimising selection, the references stage 2 approximates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gradfuse.candidate import Candidate, merge_duplicates
from gradfuse.fusion import FUSION_METHODS, UnknownMethod, check_fusion, fuse
from gradfuse.rerank import RerankOutcome, RerankSettings, gradient_rerank, load_scorer, loo_greedy_rerank, loo_rerank
from gradfuse.selection import SelectionDecision, SelectionSettings, select_sources

PIPELINE_METHODS = ("dense", "select", "gradient", "gro", "loo", "loo-greedy")
LM_METHODS = ("gradient", "gro", "loo", "loo-greedy")  # the ones that run the scoring LM
METHODS: tuple[str, ...] = (*FUSION_METHODS, *PIPELINE_METHODS)


def check_method(method: str, sources: list[str]) -> None:
    """Raise UnknownMethod with every valid choice when `method` cannot run over `sources`."""
    if method in PIPELINE_METHODS:
        return
    if method.startswith("single:") or method in FUSION_METHODS:
        check_fusion(method, sources)  # names the missing source of a single:<source>
        return
    raise UnknownMethod(f"unknown method {method!r} (choose from {', '.join(METHODS)})")


@dataclass
class MethodContext:
    """What the pipeline methods need beyond the candidates: the encoder's view and the scoring LM's settings."""

    question: str
    query_vector: np.ndarray
    embed: Callable[[list[Candidate]], np.ndarray]  # normalised vectors, one row per candidate
    selection: SelectionSettings
    rerank: RerankSettings
    gold: str | None = None
    k: int = 10


@dataclass
class MethodResult:
    candidates: list[Candidate]
    selection: SelectionDecision | None = None
    rerank: RerankOutcome | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # per pipeline step: selection, prior, target, lm_pass


def run_method(
    method: str,
    ranked_lists: dict[str, list[Candidate]],
    *,
    weights: dict[str, float] | None = None,
    context: MethodContext | None = None,
) -> MethodResult:
    """`weights` (per source) apply wherever sources are fused; pipeline methods also need `context`."""
    if method not in PIPELINE_METHODS:
        return MethodResult(fuse(method, ranked_lists, weights=weights))
    assert context is not None, "pipeline methods need a MethodContext"
    decision, seconds = None, {}
    started = time.perf_counter()
    if method in ("select", "gro"):
        vectors = {s: context.embed(c[: context.selection.candidates]) for s, c in ranked_lists.items()}
        decision = select_sources(context.query_vector, vectors, context.selection)
        ranked_lists = {s: ranked_lists[s] for s in decision.sources}
        seconds["selection"] = time.perf_counter() - started
        if method == "select":
            return MethodResult(fuse("rrf", ranked_lists, weights=weights), selection=decision, seconds=seconds)
    started = time.perf_counter()
    pooled = _pool_by_prior(ranked_lists, context)
    seconds["prior"] = time.perf_counter() - started
    if method == "dense":
        return MethodResult(pooled, seconds=seconds)
    scorer = load_scorer(context.rerank.model, context.rerank.doc_tokens)
    if method == "loo":
        outcome = loo_rerank(scorer, context.question, pooled, context.rerank, gold=context.gold)
    elif method == "loo-greedy":
        outcome = loo_greedy_rerank(scorer, context.question, pooled, context.rerank, k=context.k,
                                    gold=context.gold)
    else:
        outcome = gradient_rerank(scorer, context.question, pooled, context.rerank, gold=context.gold)
    rest = pooled[context.rerank.n :]
    seconds.update(target=outcome.target_seconds, lm_pass=outcome.seconds - outcome.target_seconds)
    return MethodResult(outcome.ranked + rest, selection=decision, rerank=outcome, seconds=seconds)


def _pool_by_prior(ranked_lists: dict[str, list[Candidate]], context: MethodContext) -> list[Candidate]:
    """Deduplicated candidates of the given sources, ranked by cosine to the query (their prior)."""
    primaries, _ = merge_duplicates(ranked_lists)
    pool = list(primaries.values())
    if not pool:
        return []
    priors = context.embed(pool) @ context.query_vector
    for candidate, prior in zip(pool, priors):
        candidate.scores["prior"] = float(prior)
    return sorted(pool, key=lambda c: (-c.scores["prior"], c.native_rank, c.key))
