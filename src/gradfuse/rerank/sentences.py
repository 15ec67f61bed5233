"""Stage 2 at the sentence level: a value for every sentence of the passages the generator will see, by one
scorer of one interface (`SentenceScorer`), next to the document-level scorers.

The reader gate's one pass is where the gradient's cost advantage is largest: 5 passages of 5-10 sentences are
25-50 units, which UPR scores with 25-50 passes and leave-one-out with 26-51, while the gate's forward + backward
pass covers them all at once (documents encoded once without gradients, see lm_scorer.py).

- support: no language model: a weighted sum of a sentence's signals (the share of the question's rare words it
  holds, and those that held-out question sets chose beside it; rerank/support.py);
- gate: -dL/dlog(alpha_s) for each sentence s, the first-order rise of the target's loss as attention to s is
  turned down; `calibrated`: minus the same gate under the content-free target "N/A" (its second pass reuses the
  documents' cache), which removes what the position alone earns a sentence;
- cosine: the encoder's cosine between the question and each sentence (milliseconds);
- upr: log P(question | sentence), batched, one short pass per sentence;
- loo: L(context without s) - L(context), exactly, with one pass per sentence (the reference; an oracle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from gradfuse.checked import FILE_SETTINGS, Count, Flag, Text, Weight
from gradfuse.rerank import support

if TYPE_CHECKING:  # the LM scorers import torch, which the LM-free scorers do not need
    from gradfuse.rerank.lm_scorer import LMScorer

SENTENCE_SCORERS = ("support", "gate", "cosine", "upr", "loo")
TEXT_SCORERS = ("support", "cosine")  # no LM: they read a sentence's text alone
LM_SENTENCE_SCORERS = ("gate", "upr", "loo")


@dataclass(frozen=True)
class EvidenceSettings:
    """`[evidence]`: which sentences of the passages an answer quotes as its evidence."""

    __pydantic_config__ = FILE_SETTINGS
    # The defaults follow make bench-answers (results/answers/fit.md and results.md): see support.py.
    scorer: Text = "support"  # support | gate | cosine | upr | loo | none (no evidence)
    calibrated: Flag = False  # the gate minus its value under the content-free target
    target: Text = "query"  # query (likelihood of the question) | gold (a reference answer, where one is given)
    top: Count = 4  # sentences quoted with an answer
    # LM passes the evidence may take (UPR reads one sentence a pass, leave-one-out one a sentence and one for
    # all): the first passages' sentences up to it are scored. `/ask` counts them against max_lm_passes.
    max_lm_passes: Count = 32
    # Below this chance that the passages hold the answer (`support.answered`), the answer says "not found in these
    # sources" and lists what came closest; 0 never does. Chosen on dev questions with the weights (support.json).
    abstain_below: Weight = field(default_factory=lambda: support.model().abstain_below)

    def __post_init__(self):
        if self.scorer not in (*SENTENCE_SCORERS, "none"):
            raise ValueError(f"unknown evidence scorer {self.scorer!r} (choose from "
                             f"{', '.join(SENTENCE_SCORERS)}, none)")
        if self.target not in ("query", "gold"):
            raise ValueError(f"unknown evidence target {self.target!r} (choose from query, gold)")


def evidence_passes(settings: EvidenceSettings) -> int:
    """The most LM passes the evidence of one answer costs with `settings`."""
    if settings.scorer == "gate":
        return 2 if settings.calibrated else 1
    return settings.max_lm_passes if settings.scorer in ("upr", "loo") else 0


class Passage(NamedTuple):
    """One passage as the sentence scorers see it: a prefix that is never scored (its title), its text and the
    character spans of its sentences (a tuple, as `ContextPacker.pack_units` takes it)."""

    prefix: str
    text: str
    sentences: list[tuple[int, int]]

    def sentence_texts(self) -> list[str]:
        return [self.text[start:end] for start, end in self.sentences]


def score_sentences(scorer: str, question: str, passages: list[Passage], *, lm: LMScorer | None = None,
                    embed: Callable[[list[str]], np.ndarray] | None = None, query_vector: np.ndarray | None = None,
                    target: str | None = None, calibrated: bool = False) -> np.ndarray:
    """One value per sentence, in passage order then sentence order. `target`: the text whose loss the gate and
    leave-one-out score (None: the question, as query likelihood)."""
    if not any(p.sentences for p in passages):
        return np.zeros(0)
    if scorer in TEXT_SCORERS:
        return score_texts(scorer, question, [s for p in passages for s in p.sentence_texts()], embed=embed,
                           query_vector=query_vector,
                           passages=[number for number, p in enumerate(passages, start=1) for _ in p.sentences])
    if scorer == "upr":
        from gradfuse.rerank.upr import UPRScorer

        return UPRScorer(lm).values(question, [s for p in passages for s in p.sentence_texts()])
    if scorer == "gate":
        return _gate(lm, question, passages, target, calibrated)
    if scorer == "loo":
        return _leave_one_out(lm, question, passages, target)
    raise ValueError(f"unknown sentence scorer {scorer!r} (choose from {', '.join(SENTENCE_SCORERS)})")


def score_texts(scorer: str, question: str, texts: list[str], *, embed: Callable[[list[str]], np.ndarray],
                query_vector: np.ndarray, passages: list[int] | None = None,
                reader: np.ndarray | None = None) -> np.ndarray:
    """The LM-free scorers' values of sentences given as text (an answer scores a table row as it quotes it, with
    its column names), in their passages' order (`passages`: each one's passage number). `reader`: the reader's
    logits of the sentences, where the `support` model weighs them."""
    if not texts:
        return np.zeros(0)
    if scorer == "cosine":
        return embed(texts) @ query_vector
    weights = support.model().weights
    cosines = embed(texts) @ query_vector if "cosine" in weights else np.zeros(len(texts))  # encoded if weighed
    return support.sentence_values(support.signals(question, texts, cosines, passages, only=tuple(weights),
                                                   reader=reader), weights)


def _packed(lm: LMScorer, question: str, passages: list[Passage], target: str | None):
    if target is None:  # query likelihood: the question is the target, not in the prompt
        return lm.packer.pack_units(passages, question=None, target=question)
    return lm.packer.pack_units(passages, question=question, target=target)


def within_passes(scorer: str, passages: list[Passage], passes: int) -> list[Passage]:
    """The first `passages`, with as many of their sentences as `passes` LM passes score (UPR: one a sentence;
    leave-one-out: one a sentence and one for all); the gate reads them all in one pass."""
    if scorer not in ("upr", "loo"):
        return passages
    room, kept = passes - (scorer == "loo"), []
    for passage in passages:
        if room <= 0:
            break
        kept.append(passage._replace(sentences=passage.sentences[:room]))
        room -= len(kept[-1].sentences)
    return kept


def score_fitting(scorer: str, question: str, passages: list[Passage], settings, *, target: str | None = None,
                  calibrated: bool = False, device: str = "cpu") -> tuple[int, np.ndarray]:
    """An LM scorer's sentence values with plain data in and out, as an executor runs them here or on a scorer
    replica: the first passages one pass takes within `settings.max_pass_tokens` (gate and leave-one-out; UPR
    reads one sentence a pass) and the values of their sentences. `settings`: the `[rerank]` settings, whose
    scoring LM this is."""
    from gradfuse.rerank import load_scorer

    lm = load_scorer(settings.model, settings.doc_tokens, settings.dtype, device)
    fit = len(passages) if scorer == "upr" else passages_that_fit(lm, question, passages, target,
                                                                    settings.max_pass_tokens)
    return fit, score_sentences(scorer, question, passages[:fit], lm=lm, target=target, calibrated=calibrated)


def passages_that_fit(lm: LMScorer, question: str, passages: list[Passage], target: str | None,
                      max_tokens: int) -> int:
    """How many of `passages`, from the first, one gate pass can take within `max_tokens` (at least one): the
    template's tokens plus each passage's, counted once."""
    used = _packed(lm, question, [], target).length
    for count, passage in enumerate(passages):
        used += len(lm.packer.passage_ids(count + 1, passage)[0])
        if used > max_tokens:
            return max(count, 1)
    return len(passages)


def _gate(lm: LMScorer, question: str, passages: list[Passage], target: str | None, calibrated: bool) -> np.ndarray:
    packed = _packed(lm, question, passages, target)
    if not calibrated:
        return lm.attribute_reader(packed)[1]
    # The same prompt up to the last document (so the cache is shared), with "N/A" as the answer, or as the
    # question for query likelihood.
    from gradfuse.rerank.lm_scorer import CONTENT_FREE

    free = lm.packer.pack_units(passages, question=None if target is None else question, target=CONTENT_FREE)
    _, gate, content_free = lm.calibrated_reader_gate(packed, free)
    return gate - content_free


def _leave_one_out(lm: LMScorer, question: str, passages: list[Passage], target: str | None) -> np.ndarray:
    contexts = [_packed(lm, question, passages, target)]
    for p, passage in enumerate(passages):
        for start, end in passage.sentences:
            width = end - start
            kept = [(a, b) if b <= start else (a - width, b - width) for a, b in passage.sentences if a != start]
            shrunk = Passage(passage.prefix, passage.text[:start] + passage.text[end:], kept)
            contexts.append(_packed(lm, question, passages[:p] + [shrunk] + passages[p + 1:], target))
    losses = lm.losses(contexts)
    return losses[1:] - losses[0]
