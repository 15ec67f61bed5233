"""Stage 2: which documents, by what the generator needs, plus the exact leave-one-out references.

Candidates arrive ordered by their prior (cosine to the query); the first n are packed into one context, a
single forward + backward pass scores all of them, and they are re-ranked by that score (optionally mixed with
the z-normalised prior). Every score is written into `Candidate.scores`, so `--explain` can show each step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gradfuse.candidate import Candidate
from gradfuse.rerank.lm_scorer import LMScorer

ESTIMATORS = ("gate", "grad_x_input")
TARGETS = ("draft", "gold", "query")


@dataclass(frozen=True)
class RerankSettings:
    model: str = "smollm2"  # the white-box scoring LM: bundled SmolLM2, a local HF folder or a .gguf file
    n: int = 10  # candidates that enter the gradient pass
    doc_tokens: int = 128  # token budget per document
    estimator: str = "gate"
    target: str = "draft"
    length_normalise: bool = False
    both_orders: bool = False  # average the scores of the prior order and its reverse (position bias)
    # final = z(gradient) + prior_weight * z(prior); 0 ranks by the gradient alone. 4.0 was the dev choice for the
    # draft target on benchmarks/federated.toml (dev nDCG@10 0.320 at 0, 0.503 at 2, 0.519 at 4; 2.0 for the query
    # target): with the 135M scorer the gradient is best used to reorder what the prior already ranks well.
    prior_weight: float = 4.0

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r} (choose from {', '.join(ESTIMATORS)})")
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r} (choose from {', '.join(TARGETS)})")


@dataclass
class RerankOutcome:
    ranked: list[Candidate]  # the n scored candidates, best first
    target: str  # the text whose likelihood was scored
    loss: float  # L of the full packed context
    seconds: float  # all of it, target_seconds included
    target_seconds: float = 0.0  # making the target (the draft answer for target 'draft')


@lru_cache(maxsize=2)
def load_scorer(spec: str = "smollm2", doc_tokens: int = 128) -> LMScorer:
    """The scoring LM shares a loaded local generator's weights (one copy in memory)."""
    from gradfuse.generate.local import load_local_generator

    if spec.startswith(("http://", "https://")):
        raise ValueError("the re-ranking LM must run locally (gradients are needed): set [rerank] model to "
                         "'smollm2', a transformers folder or a .gguf file")
    generator = load_local_generator(spec)
    return LMScorer(generator.model, generator.tokenizer, doc_tokens=doc_tokens)


def passage_text(candidate: Candidate) -> str:
    return f"{candidate.title}: {candidate.text}" if candidate.title else candidate.text


def resolve_target(scorer: LMScorer, kind: str, question: str, docs: list[str], gold: str | None) -> str:
    if kind == "gold":
        if not gold:
            raise ValueError("target 'gold' needs a reference answer for this question")
        return gold
    if kind == "query":
        return question
    return scorer.draft(docs, question)


@dataclass
class _Prepared:
    pool: list[Candidate]  # the first n candidates
    docs: list[str]  # their texts as the LM sees them
    target: str
    target_seconds: float


def _prepare(scorer, question, candidates, settings: RerankSettings, gold) -> _Prepared:
    pool = candidates[: settings.n]
    docs = [passage_text(c) for c in pool]
    started = time.perf_counter()
    target = resolve_target(scorer, settings.target, question, docs, gold)
    return _Prepared(pool, docs, target, time.perf_counter() - started)


def _z(values: np.ndarray) -> np.ndarray:
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def gradient_rerank(
    scorer: LMScorer, question: str, candidates: list[Candidate], settings: RerankSettings, *, gold: str | None = None
) -> RerankOutcome:
    started = time.perf_counter()
    prepared = _prepare(scorer, question, candidates, settings, gold)
    pool, docs, target = prepared.pool, prepared.docs, prepared.target
    query_target = settings.target == "query"
    orders = [list(range(len(pool)))] + ([list(reversed(range(len(pool))))] if settings.both_orders else [])
    totals = {name: np.zeros(len(pool)) for name in ESTIMATORS}
    loss = 0.0
    for order in orders:
        packed = scorer.pack([docs[i] for i in order], question, target, target_is_query=query_target)
        attribution = scorer.attribute(packed)
        loss += attribution.loss / len(orders)
        for name in ESTIMATORS:
            values = getattr(attribution, name)
            if settings.length_normalise:
                values = values / attribution.doc_lengths
            totals[name][order] += values / len(orders)
    prior = np.array([c.scores["prior"] for c in pool])
    final = _z(totals[settings.estimator]) + settings.prior_weight * _z(prior)
    for i, candidate in enumerate(pool):
        for name in ESTIMATORS:
            candidate.scores[f"rerank:{name}"] = float(totals[name][i])
        candidate.scores["rerank:final"] = float(final[i])
    ranked = [pool[i] for i in np.argsort(-final, kind="stable")]
    return RerankOutcome(ranked, target, loss, time.perf_counter() - started, prepared.target_seconds)


def loo_rerank(
    scorer: LMScorer, question: str, candidates: list[Candidate], settings: RerankSettings, *, gold: str | None = None
) -> RerankOutcome:
    """Exact leave-one-out: L(C without i) - L(C) for each document, n + 1 forward passes."""
    started = time.perf_counter()
    prepared = _prepare(scorer, question, candidates, settings, gold)
    pool = prepared.pool
    loss, deltas = scorer.leave_one_out(prepared.docs, question, prepared.target,
                                        target_is_query=settings.target == "query")
    for candidate, delta in zip(pool, deltas):
        candidate.scores["rerank:loo"] = float(delta)
        candidate.scores["rerank:final"] = float(delta)
    ranked = [pool[i] for i in np.argsort(-deltas, kind="stable")]
    return RerankOutcome(ranked, prepared.target, loss, time.perf_counter() - started, prepared.target_seconds)


def loo_greedy_rerank(
    scorer: LMScorer, question: str, candidates: list[Candidate], settings: RerankSettings, *, k: int,
    gold: str | None = None,
) -> RerankOutcome:
    """Greedy forward selection of k documents minimising L (the expensive oracle); the rest follow by prior."""
    started = time.perf_counter()
    prepared = _prepare(scorer, question, candidates, settings, gold)
    pool = prepared.pool
    chosen, loss = scorer.greedy_selection(prepared.docs, question, prepared.target, k)
    order = chosen + [i for i in range(len(pool)) if i not in chosen]
    for position, i in enumerate(order):
        pool[i].scores["rerank:final"] = float(len(order) - position)
    return RerankOutcome([pool[i] for i in order], prepared.target, loss, time.perf_counter() - started,
                         prepared.target_seconds)
