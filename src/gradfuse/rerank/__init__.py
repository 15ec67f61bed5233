"""Stage 2: which documents, by what the generator needs, next to the LM baselines and the exact references.

One interface (`Stage2Scorer`, base.py), one file per scorer, one factory (`make_scorer`), and `score_pool`, all
the LM work of one re-rank as plain data, which an executor runs here or on a Ray cluster (gradfuse.execute):

- gradient.py: the GRO-RAG estimate from one forward + backward pass (gate, reader gate, grad x input), and the
  reader gate calibrated by a content-free target;
- attention.py: in-context re-ranking, the question's attention to each passage minus a content-free question's;
- conditional.py: selection as a set, each round's reader gate given the documents chosen so far;
- set_upr.py: its exact reference, log P(question | chosen + candidate) per round;
- loo.py: exact leave-one-out and greedy loss-minimising selection (the oracles the gradient approximates);
- upr.py: query likelihood per passage; relevance.py: a yes/no relevance prompt (the same scoring LM);
- cross_encoder.py: a sentence-transformers cross-encoder from a local folder;
- sentences.py: the LM scorers' values for the sentences of the passages an answer shows (reading/ uses them).

`rerank` takes the first n candidates of a pool (pools.py), asks the scorer for a value per document, combines it
with the prior (base.combine) and writes every value into `Candidate.scores`, so `--explain` can show each step.
"""

from __future__ import annotations

import functools
import importlib
import time

import numpy as np

from gradfuse.candidate import Candidate
from gradfuse.loading import loaded_once
from gradfuse.rerank.base import (
    DTYPES,
    ESTIMATORS,
    MIXES,
    POOLS,
    PRIORS,
    TARGETS,
    PassTooLong,
    RerankOutcome,
    RerankSettings,
    SIGNALS,
    Scored,
    Stage2Scorer,
    combine,
    passage_text,
)
from gradfuse.rerank.cross_encoder import CrossEncoderMissing
from gradfuse.rerank.precision import resolve_dtype

__all__ = ["DTYPES", "ESTIMATORS", "MIXES", "POOLS", "PRIORS", "SCORERS", "SIGNALS", "TARGETS", "CrossEncoderMissing",
           "PassTooLong", "RerankOutcome", "RerankSettings", "Scored", "Stage2Scorer", "load_scorer", "make_scorer",
           "passage_text", "rerank", "score_pool"]

# scorer name → the module (in this package) and class that computes it; imported on first use, because every LM
# scorer imports torch, which a CLI that never re-ranks should not pay for (gradfuse.methods.METHOD_SPECS says which
# scorer each method runs: gro runs gradient)
SCORERS = {"gradient": "gradient:GradientScorer", "calibrated-gate": "gradient:CalibratedGateScorer",
           "attention": "attention:AttentionScorer", "conditional-gate": "conditional:ConditionalGateScorer",
           "set-upr": "set_upr:SetUPRScorer", "loo": "loo:LeaveOneOutScorer", "loo-greedy": "loo:GreedyLossScorer",
           "upr": "upr:UPRScorer", "relevance": "relevance:RelevancePromptScorer",
           "cross-encoder": "cross_encoder:CrossEncoderScorer"}


def scorer_class(scorer: str) -> type:
    module, name = SCORERS[scorer].split(":")
    return getattr(importlib.import_module(f"gradfuse.rerank.{module}"), name)


POINTWISE = ("upr", "relevance")  # one short pass per document: the longest reads one document, not n


def load_scorer(spec: str = "smollm2", doc_tokens: int = 128, dtype: str = "auto", device: str = "cpu"):
    """The scoring LM, loaded once per process (shares a loaded transformers model's weights where the precision
    is the same). Drafts stay in transformers: they share the documents' cache with the reader-gate pass, and
    llama.cpp's prompt processing (about 270 tokens/s here, its wheel built without AVX-512) is slower than
    transformers' (about 600) on the long packed contexts."""
    if spec.startswith(("http://", "https://")):
        raise ValueError("the re-ranking LM must run locally (gradients are needed): set [rerank] model to "
                         "'smollm2', a transformers folder or a .gguf file")
    _converted_before_loading(spec)
    return _cached_scorer(spec, doc_tokens, resolve_dtype(dtype, device), device)


@functools.cache
def _converted_before_loading(spec: str) -> None:
    """A GGUF spec's de-quantised copy, made in a child before the loading lock is taken (a first conversion
    takes half a minute). Once per spec: load_scorer runs on every re-rank, and the file need not be looked at
    again once the scorer is loaded."""
    from gradfuse.lm.gguf_copy import ensure_converted
    from gradfuse.lm.models import gguf_file

    if (gguf := gguf_file(spec)) is not None:
        ensure_converted(gguf)


@loaded_once(maxsize=4)
def _cached_scorer(spec: str, doc_tokens: int, dtype: str, device: str):
    from gradfuse.lm.models import load_transformers
    from gradfuse.rerank.lm_scorer import LMScorer

    tokenizer, model = load_transformers(spec)
    # A GPU scorer replica (gradfuse.execute) moves its process's copy; in-process scoring stays on the CPU.
    return LMScorer(model.to(device), tokenizer, doc_tokens=doc_tokens, dtype=dtype)


def make_scorer(scorer: str, settings: RerankSettings, device: str = "cpu") -> Stage2Scorer:
    if scorer == "cross-encoder":
        return scorer_class(scorer)(settings.cross_encoder)
    return scorer_class(scorer)(load_scorer(settings.model, settings.doc_tokens, settings.dtype, device))


def score_pool(scorer_name: str, question: str, docs: list[str], settings: RerankSettings, *,
               gold: str | None = None, k: int = 10, device: str = "cpu") -> Scored:
    """All the LM work of one re-rank, with plain data in and out: the scorer's values for `docs`, and UPR's when
    UPR is the prior. This is what an executor runs, in this process or on a scorer replica (gradfuse.execute)."""
    scorer = make_scorer(scorer_name, settings, device)
    if hasattr(scorer, "lm"):  # an LM scorer: checked before any pass, where the tokenizer is
        longest = scorer.lm.longest_pass(docs, question, settings, gold=gold, pointwise=scorer_name in POINTWISE)
        if longest > settings.max_pass_tokens:
            raise PassTooLong(longest, settings.max_pass_tokens)
    scored = scorer.score(question, docs, settings, gold=gold, k=k)
    if scored.mixes and settings.prior == "upr" and "upr" not in scored.values:
        upr = scorer_class("upr")(load_scorer(settings.model, settings.doc_tokens, settings.dtype, device))
        scored.values["upr"] = upr.values(question, docs)
    return scored


def rerank(scorer: str, question: str, candidates: list[Candidate], settings: RerankSettings, *,
           gold: str | None = None, k: int = 10, executor=None) -> RerankOutcome:
    """Score the first `settings.n` candidates (ordered by their prior) with `scorer` (a SCORERS name) and re-rank
    them. `executor` runs the LM work (gradfuse.execute; None: this process)."""
    started = time.perf_counter()
    pool = candidates[: settings.n]
    docs = [passage_text(c) for c in pool]
    scored = (executor.score(scorer, question, docs, settings, gold=gold, k=k) if executor is not None
              else score_pool(scorer, question, docs, settings, gold=gold, k=k))
    prior = np.array([c.scores["prior"] for c in pool])
    if scored.mixes and settings.prior == "upr":
        for candidate, value in zip(pool, scored.values["upr"]):
            candidate.scores["prior:pool"], candidate.scores["prior"] = candidate.scores["prior"], float(value)
        prior = np.asarray(scored.values["upr"], dtype=float)
    main = scored.values[scored.main]
    final = combine(main, prior, mix=settings.mix, prior_weight=settings.prior_weight,
                    within_m=settings.within_m) if scored.mixes else main
    for i, candidate in enumerate(pool):
        for name, values in scored.values.items():
            candidate.scores[f"rerank:{name}"] = float(values[i])
        candidate.scores["rerank:final"] = float(final[i])
    ranked = [pool[i] for i in np.argsort(-final, kind="stable")]
    return RerankOutcome(ranked, scored.target, scored.loss, time.perf_counter() - started, scored.target_seconds,
                         scorer, f"rerank:{scored.main}")
