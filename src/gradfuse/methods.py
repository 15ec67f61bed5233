"""Every ranking method by name, over one federated result: the uniform baselines and the per-query method.

- concat, rrf, combsum[-z], combmnz[-z], single:<source>: uniform fusion (`gradfuse.fusion`);
- dense: all sources' candidates pooled, deduplicated and ranked by encoder cosine to the query;
- select: stage 1 (`gradfuse.selection`) chooses the sources, then one fusion of them (`[selection] fusion`), or,
  with `[selection] choice = "soft"`, weighs every source's passages by its gain (`gradfuse.selection.soft`);
- gradient: stage 2 (`gradfuse.rerank`) over a pool of every source's candidates;
- gro: stage 1, then stage 2 over the chosen sources' pool by the signal `[rerank] scorer` names (the full
  method); gro-calibrated: the reader gate minus the gate of a content-free target;
- attention: stage 1, then in-context re-ranking (the question's calibrated attention to each passage);
- conditional, set-upr: stage 1, then the first `set_rounds` documents chosen as a set, greedily, by the reader
  gate given the ones chosen so far (one short pass a round) or exactly by log P(question | chosen + candidate);
- upr, relevance, cross-encoder: stage 1, then the same pool re-ranked by an LM baseline instead of the gradient;
- loo, loo-greedy: exact leave-one-out and greedy loss-minimising selection, the references stage 2 approximates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gradfuse.candidate import Candidate
from gradfuse.fusion import FUSION_METHODS, UnknownMethod, check_fusion, fuse
from gradfuse.rerank import RerankOutcome, RerankSettings, rerank
from gradfuse.rerank.pools import ordered_pool
from gradfuse.selection import SelectionDecision, SelectionSettings, select_sources
from gradfuse.selection.soft import weigh_by_source

@dataclass(frozen=True)
class MethodSpec:
    """One pipeline method: whether stage 1 chooses its sources first, the stage-2 scorer it runs
    (`gradfuse.rerank.SCORERS`; None: the pool's cosine order is the ranking), whether that scorer reads a
    target's likelihood, whether its value is mixed with the pool's prior, and how many LM passes one request costs
    over a pool of n for the top k with `rounds` set rounds (a forward and its backward over the packed pool count
    as one pass, a prompt per passage as one short pass each; the server refuses a request above its
    `max_lm_passes`)."""

    stage1: bool
    scorer: str | None = None  # "configured": the one `[rerank] scorer` names
    target: bool = False
    mixes: bool = False
    passes: Callable[[int, int, int], int] = lambda n, k, rounds: 0


def _per_passage(n: int, k: int, rounds: int) -> int:
    return n


def _greedy(n: int, rounds: int) -> int:
    """Forward passes of greedy selection: every remaining candidate, each round."""
    return sum(n - step for step in range(min(rounds, n)))


CONFIGURED = "configured"
# A new stage-2 method is a row.
METHOD_SPECS: dict[str, MethodSpec] = {
    "dense": MethodSpec(stage1=False),
    "select": MethodSpec(stage1=True),
    "gradient": MethodSpec(stage1=False, scorer="gradient", target=True, mixes=True, passes=lambda n, k, r: 1),
    "gro": MethodSpec(stage1=True, scorer=CONFIGURED, target=True, mixes=True),
    "gro-calibrated": MethodSpec(stage1=True, scorer="calibrated-gate", target=True, mixes=True,
                                 passes=lambda n, k, r: 2),
    "attention": MethodSpec(stage1=True, scorer="attention", mixes=True, passes=lambda n, k, r: 1),
    "conditional": MethodSpec(stage1=True, scorer="conditional-gate", passes=lambda n, k, r: min(r, k, n)),
    "set-upr": MethodSpec(stage1=True, scorer="set-upr", passes=lambda n, k, r: _greedy(n, min(r, k))),
    "loo": MethodSpec(stage1=False, scorer="loo", target=True, passes=lambda n, k, r: n + 1),
    # loo-greedy grows as n k (n = 50, k = 50: 1,276 passes)
    "loo-greedy": MethodSpec(stage1=False, scorer="loo-greedy", target=True, passes=lambda n, k, r: 1 + _greedy(n, k)),
    "upr": MethodSpec(stage1=True, scorer="upr", mixes=True, passes=_per_passage),
    "relevance": MethodSpec(stage1=True, scorer="relevance", mixes=True, passes=_per_passage),
    "cross-encoder": MethodSpec(stage1=True, scorer="cross-encoder", mixes=True, passes=_per_passage),
}
PIPELINE_METHODS = tuple(METHOD_SPECS)
STAGE2_METHODS = tuple(m for m, spec in METHOD_SPECS.items() if spec.scorer)
LM_METHODS = STAGE2_METHODS  # the ones that run a model per query (the server's admission line counts them)
TARGET_METHODS = tuple(m for m, spec in METHOD_SPECS.items() if spec.target)
STAGE1_METHODS = tuple(m for m, spec in METHOD_SPECS.items() if spec.stage1)
MIXED_METHODS = tuple(m for m, spec in METHOD_SPECS.items() if spec.mixes)  # scores mixed with the pool's prior
METHODS: tuple[str, ...] = (*FUSION_METHODS, *PIPELINE_METHODS)
METHOD_CHOICES = " | ".join(METHODS)  # for help texts


def spec_of(method: str, scorer: str = "gradient") -> MethodSpec:
    """A method's row, with `gro`'s signal resolved to `scorer` (`[rerank] scorer`): its cost and whether it takes
    a target are that scorer's."""
    spec = METHOD_SPECS[method]
    if spec.scorer != CONFIGURED:
        return spec
    own = next(s for s in METHOD_SPECS.values() if s.scorer == scorer)
    return MethodSpec(stage1=True, scorer=scorer, target=own.target, mixes=own.mixes, passes=own.passes)


def lm_passes(method: str, n: int, k: int, rounds: int = 3, scorer: str = "gradient", prior: str = "pool") -> int:
    """How many LM passes one request of `method` costs over a pool of n for the top k, with `rounds` set rounds
    (`[rerank] set_rounds`), `scorer` as `gro`'s signal (`[rerank] scorer`) and `prior` (`[rerank] prior`: "upr"
    adds UPR's n passes over the pool to a method that mixes another signal with it); 0: none."""
    if method not in METHOD_SPECS:
        return 0
    spec = spec_of(method, scorer)
    upr_prior = n if prior == "upr" and spec.mixes and spec.scorer != "upr" else 0
    return spec.passes(n, k, rounds) + upr_prior


def options_read(method: str, scorer: str) -> tuple[str, ...]:
    """The request options beyond the query, k, sources and retrieval that `method` reads, with `scorer` as gro's
    signal: a client (the page) offers only these."""
    if method not in METHOD_SPECS:
        return ()
    spec = spec_of(method, scorer)
    read = ("scorer",) if METHOD_SPECS[method].scorer == CONFIGURED else ()
    if spec.scorer:
        read += ("n", "pool")
    if spec.target:
        read += ("target",)
    if spec.scorer == "gradient":
        read += ("estimator",)
    return read


def check_method(method: str, sources: list[str]) -> None:
    """Raise UnknownMethod with every valid choice when `method` cannot run over `sources`."""
    if method in PIPELINE_METHODS:
        return
    if method.startswith("single:") or method in FUSION_METHODS:
        check_fusion(method, sources)  # names the missing source of a single:<source>
        return
    choices = f"(choose from {', '.join(METHODS)})"
    raise UnknownMethod(f"unknown method {method!r} {choices}", f"method: unknown method {choices}")


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
    executor: object = None  # where the LM work runs (gradfuse.execute.Executor); None: this process


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
    spec = spec_of(method, context.rerank.scorer)
    decision, seconds = None, {}
    started = time.perf_counter()
    if spec.stage1:
        vectors = {s: context.embed(c[: context.selection.candidates]) for s, c in ranked_lists.items()}
        decision = select_sources(context.query_vector, vectors, context.selection)
        ranked_lists = {s: ranked_lists[s] for s in decision.sources}
        seconds["selection"] = time.perf_counter() - started
    started = time.perf_counter()
    if method == "select" and context.selection.fusion != "dense":
        return MethodResult(fuse(context.selection.fusion, ranked_lists, weights=weights), selection=decision,
                            seconds=seconds)
    pool_kind = context.rerank.pool if spec.scorer else "cosine"
    pooled = ordered_pool(ranked_lists, pool_kind, query_vector=context.query_vector, embed=context.embed,
                          weights=weights)
    if decision is not None and context.selection.choice == "soft" and pool_kind == "cosine":
        pooled = weigh_by_source(pooled, {step.source: step.gain for step in decision.chosen},
                                 context.selection.soft_weight)
    seconds["prior"] = time.perf_counter() - started
    if spec.scorer is None:
        return MethodResult(pooled, selection=decision, seconds=seconds)
    outcome = rerank(spec.scorer, context.question, pooled, context.rerank, gold=context.gold, k=context.k,
                     executor=context.executor)
    rest = pooled[context.rerank.n :]
    seconds.update(target=outcome.target_seconds, lm_pass=outcome.seconds - outcome.target_seconds)
    return MethodResult(outcome.ranked + rest, selection=decision, rerank=outcome, seconds=seconds)
