"""Stage 2 at the sentence level: the scoring LM's value for every sentence of the passages an answer shows, for
its evidence (reading/scoring.py chooses among these and the LM-free scorers).

The reader gate's one pass is where the gradient's cost advantage is largest: 5 passages of 5-10 sentences are
25-50 units, which UPR scores with 25-50 passes and leave-one-out with 26-51, while the gate's forward + backward
pass covers them all at once (documents encoded once without gradients, see lm_scorer.py).

- gate: -dL/dlog(alpha_s) for each sentence s, the first-order rise of the target's loss as attention to s is
  turned down; `calibrated`: minus the same gate under the content-free target "N/A" (its second pass reuses the
  documents' cache), which removes what the position alone earns a sentence;
- upr: log P(question | sentence), batched, one short pass per sentence;
- loo: L(context without s) - L(context), exactly, with one pass per sentence (the reference; an oracle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # the LM scorers import torch, which the LM-free scorers do not need
    from gradfuse.rerank.lm_scorer import LMScorer

LM_SENTENCE_SCORERS = ("gate", "upr", "loo")


class Passage(NamedTuple):
    """One passage as the sentence scorers see it: a prefix that is never scored (its title), its text and the
    character spans of its sentences (a tuple, as `ContextPacker.pack_units` takes it)."""

    prefix: str
    text: str
    sentences: list[tuple[int, int]]

    def sentence_texts(self) -> list[str]:
        return [self.text[start:end] for start, end in self.sentences]


def score_sentences(scorer: str, question: str, passages: list[Passage], *, lm: LMScorer,
                    target: str | None = None, calibrated: bool = False) -> np.ndarray:
    """One value per sentence, in passage order then sentence order. `target`: the text whose loss the gate and
    leave-one-out score (None: the question, as query likelihood)."""
    if not any(p.sentences for p in passages):
        return np.zeros(0)
    if scorer == "upr":
        from gradfuse.rerank.upr import UPRScorer

        return UPRScorer(lm).values(question, [s for p in passages for s in p.sentence_texts()])
    if scorer == "gate":
        return _gate(lm, question, passages, target, calibrated)
    if scorer == "loo":
        return _leave_one_out(lm, question, passages, target)
    raise ValueError(f"unknown sentence scorer {scorer!r} (choose from {', '.join(LM_SENTENCE_SCORERS)})")


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
