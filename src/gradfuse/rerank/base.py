"""What every stage-2 scorer shares: its settings, the interface, the record of one re-rank, and how a scorer's
values are combined with the prior that ordered the pool.

A scorer looks at the first n candidates of a pool (ordered by a prior: encoder cosine or a fusion of the chosen
sources, see `pools.py`) and gives every one of them a value (`Scored`). The final order is that value alone, the
z-scored value plus `prior_weight` times the z-scored prior (`mix = "zsum"`), or the prior's order with only its top
`within_m` reordered by the value (`mix = "within"`): the last keeps a strong prior's ranking below the head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gradfuse.checked import FILE_SETTINGS, Count, Flag, Number, Text

from gradfuse.candidate import Candidate

ESTIMATORS = ("gate", "reader_gate", "grad_x_input")
TARGETS = ("draft", "gold", "query")
POOLS = ("cosine", "rrf", "combsum-z")
PRIORS = ("pool", "upr")
MIXES = ("zsum", "within")
DTYPES = ("auto", "float32", "bfloat16")
ATTENTION_WINDOWS = ("all", "first-third", "middle-third", "last-third", "middle-half")  # see attention.py
# The stage-2 signals `gro` can run after stage 1 (`[rerank] scorer`; gradfuse.rerank.SCORERS has each one).
SIGNALS = ("gradient", "calibrated-gate", "attention", "conditional-gate", "set-upr", "upr", "relevance",
           "cross-encoder")


@dataclass(frozen=True)
class RerankSettings:
    __pydantic_config__ = FILE_SETTINGS
    model: Text = "smollm2"  # the white-box scoring LM: bundled SmolLM2, a local HF folder or a .gguf file
    # The signal `gro` ranks by after stage 1 (SIGNALS). UPR: over the federated, QA and DL19 benchmarks it ranks
    # best on the held-out queries of the signals all three measured (bench/stage2_defaults.py,
    # results/stage2/defaults.md); the gradient, behind it everywhere with this 135M LM, stays available by name.
    scorer: Text = "upr"
    n: Count = 10  # candidates that enter the pass
    doc_tokens: Count = 128  # token budget per document
    # The reader gate: about 5 times cheaper than the full gate at n = 10 x 128 tokens on a CPU (results/stage2).
    estimator: Text = "reader_gate"
    target: Text = "draft"
    length_normalise: Flag = False
    both_orders: Flag = False  # average the scores of the prior order and its reverse (position bias)
    # final = z(score) + prior_weight * z(prior); 0 ranks by the score alone. 1.0 is the point of UPR's dev grids
    # with the least mean regret over the three benchmarks (results/stage2/defaults.md); the gradient's own dev
    # choices were 2 to 4 (with the 135M scorer it is best used to reorder what the prior already ranks well).
    prior_weight: Number = 1.0
    pool: Text = "cosine"  # which ranking picks the n candidates and gives their prior (see pools.py)
    prior: Text = "pool"  # the prior in the mix: the pool's own score, or UPR's query likelihood over the pool
    mix: Text = "zsum"
    within_m: Count = 3  # mix "within": how many of the prior's first candidates the score may reorder
    # The scoring LM's precision: auto is bfloat16 where the CPU (AVX512-BF16, AMX) or GPU computes it natively,
    # float32 elsewhere (precision.py): the same ranking at about half the time (results/latency).
    dtype: Text = "auto"
    draft_tokens: Count = 32  # the draft target's length cap
    cross_encoder: Text = ""  # a local sentence-transformers CrossEncoder folder, for the cross-encoder method
    # The longest sequence one LM pass may read: question, target and the packed documents. A backward pass's
    # memory grows faster than linearly with it (a 1,165-character query took a server from 2.8 to 5.6 GB; 800
    # words failed to allocate under 16 GB); the default n = 10 x 128 tokens with a short question is about 1,450.
    max_pass_tokens: Count = 2048
    attention_layers: Text = "all"  # the attention scorer's layers (attention.py): all, a third, or the middle half
    # The conditional methods (conditional-gate, set-upr): how many documents are chosen as a set, one a round; the
    # rest follow in the prior's order.
    set_rounds: Count = 3

    def __post_init__(self):
        for name, allowed in (("estimator", ESTIMATORS), ("target", TARGETS), ("pool", POOLS), ("prior", PRIORS),
                              ("mix", MIXES), ("dtype", DTYPES),
                              ("attention_layers", ATTENTION_WINDOWS), ("scorer", SIGNALS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r} (choose from {', '.join(allowed)})")
        if min(self.n, self.within_m, self.draft_tokens, self.max_pass_tokens, self.set_rounds) < 1:
            raise ValueError("n, within_m, draft_tokens, max_pass_tokens and set_rounds must be at least 1")


class PassTooLong(ValueError):
    """One LM pass of a request would read more tokens than `max_pass_tokens` allows."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"this request's stage-2 LM pass would read {tokens} tokens (question, target and n "
                         f"documents of up to doc_tokens each); the limit is {limit} (max_pass_tokens): shorten "
                         "the question or the gold answer, or lower n")
        self.tokens, self.limit = tokens, limit


@dataclass
class Scored:
    """A scorer's values for the documents it was given, in their order."""

    values: dict[str, np.ndarray]  # name → one value per document (stored as `rerank:<name>` on the candidates)
    main: str  # the value that ranks
    target: str | None = None  # the text whose likelihood was scored (LM scorers)
    loss: float | None = None  # L of the full packed context (gradient, leave-one-out)
    target_seconds: float = 0.0  # making the target (the draft answer for target 'draft')
    mixes: bool = True  # False for the leave-one-out oracles: their order is reported as it is


class Stage2Scorer(Protocol):
    name: str

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        """Values for `docs` (the pool's passages as the LM sees them, best prior first)."""


@dataclass
class RerankOutcome:
    ranked: list[Candidate]  # the n scored candidates, best first
    target: str | None  # the text whose likelihood was scored (None for scorers without one)
    loss: float | None  # L of the full packed context, where the scorer computes it
    seconds: float  # all of it, target_seconds included
    target_seconds: float = 0.0  # making the target (the draft answer for target 'draft')
    scorer: str = ""
    score_key: str = "rerank:final"  # the candidate score the scorer ranks by (rerank:gate, rerank:upr, ...)


def chosen_then_rest(chosen: list[int], n: int) -> list[int]:
    """A set scorer's final order: the chosen documents, then the rest in the prior's order."""
    return chosen + [i for i in range(n) if i not in chosen]


def chosen_first(chosen: list[int], n: int) -> np.ndarray:
    """Values (n, n - 1, ...) that rank `chosen_then_rest(chosen, n)` first to last: a set scorer's output."""
    values = np.empty(n)
    values[chosen_then_rest(chosen, n)] = np.arange(n, 0, -1, dtype=float)
    return values


def passage_text(candidate: Candidate) -> str:
    return f"{candidate.title}: {candidate.text}" if candidate.title else candidate.text


def z_scores(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def combine(score: np.ndarray, prior: np.ndarray, *, mix: str, prior_weight: float, within_m: int) -> np.ndarray:
    """The final value of each document (higher first) from a scorer's value and the prior, as described above."""
    score, prior = np.asarray(score, dtype=float), np.asarray(prior, dtype=float)
    if mix == "zsum":
        return z_scores(score) + prior_weight * z_scores(prior)
    by_prior = np.argsort(-prior, kind="stable")
    head = by_prior[:within_m]
    order = list(head[np.argsort(-score[head], kind="stable")]) + list(by_prior[within_m:])
    final = np.empty(len(score))
    final[order] = np.arange(len(score), 0, -1, dtype=float)
    return final
