"""Which scorer values an answer's sentences (`[evidence]`), and the LM-free ones themselves.

- support: no language model: a weighted sum of a sentence's signals (the share of the question's rare words it
  holds, and those that held-out question sets chose beside it; support.py);
- cosine: the encoder's cosine between the question and each sentence (milliseconds);
- reader: the reader's logit alone, every sentence read: the one trained here (reader.py) or the local model that
  `[evidence] reader` names (local_reader.py);
- gate, upr, loo: the scoring LM's values per sentence, stage 2's passes at the sentence level
  (rerank/sentences.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gradfuse.checked import FILE_SETTINGS, Count, Flag, Text, Weight
from gradfuse.reading import support
from gradfuse.rerank.sentences import LM_SENTENCE_SCORERS, Passage, score_sentences

if TYPE_CHECKING:  # the LM scorers import torch, which the LM-free scorers do not need
    from gradfuse.rerank.lm_scorer import LMScorer

TEXT_SCORERS = ("support", "cosine", "reader")  # no scoring LM: they read a sentence's text alone
SENTENCE_SCORERS = (*TEXT_SCORERS, *LM_SENTENCE_SCORERS)


@dataclass(frozen=True)
class EvidenceSettings:
    """`[evidence]`: which sentences of the passages an answer quotes as its evidence."""

    __pydantic_config__ = FILE_SETTINGS
    # The defaults follow make bench-answers (results/answers/fit.md and results.md): see support.py.
    scorer: Text = "support"  # support | cosine | reader | gate | upr | loo | none (no evidence)
    # The `reader` scorer's model: a local Hugging Face sequence-classification folder (a relevance cross-encoder,
    # an NLI or hallucination-detection model; docs/answers.md lists some); "": the reader trained here.
    reader: Text = ""
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
        if self.reader and self.scorer != "reader":
            raise ValueError(f"[evidence] reader is read by the reader scorer only: set [evidence] scorer = "
                             f"\"reader\" to use it (scorer is {self.scorer!r})")


def evidence_passes(settings: EvidenceSettings) -> int:
    """The most LM passes the evidence of one answer costs with `settings`."""
    if settings.scorer == "gate":
        return 2 if settings.calibrated else 1
    return settings.max_lm_passes if settings.scorer in ("upr", "loo") else 0


def score_evidence(scorer: str, question: str, passages: list[Passage], *, lm: LMScorer | None = None,
                   embed: Callable[[list[str]], np.ndarray] | None = None, query_vector: np.ndarray | None = None,
                   target: str | None = None, calibrated: bool = False) -> np.ndarray:
    """One value per sentence by any evidence scorer, in passage order then sentence order (the LM's on this
    process: an answer runs them on its executor)."""
    if scorer not in TEXT_SCORERS:
        return score_sentences(scorer, question, passages, lm=lm, target=target, calibrated=calibrated)
    return score_texts(scorer, question, [s for p in passages for s in p.sentence_texts()], embed=embed,
                       query_vector=query_vector,
                       passages=[number for number, p in enumerate(passages, start=1) for _ in p.sentences])


def score_texts(scorer: str, question: str, texts: list[str], *, embed: Callable[[list[str]], np.ndarray],
                query_vector: np.ndarray, passages: list[int] | None = None,
                reader: np.ndarray | None = None) -> np.ndarray:
    """The LM-free scorers' values of sentences given as text (an answer scores a table row as it quotes it, with
    its column names), in their passages' order (`passages`: each one's passage number). `reader`: the reader's
    logits of the sentences, where the `support` model weighs them and for the reader scorer."""
    if not texts:
        return np.zeros(0)
    if scorer == "reader":
        if reader is None:
            raise ValueError("the reader scorer needs the reader's logits of the sentences (reading/reader.py)")
        return np.asarray(reader, dtype=float)
    if scorer == "cosine":
        return embed(texts) @ query_vector
    weights = support.model().weights
    cosines = embed(texts) @ query_vector if "cosine" in weights else np.zeros(len(texts))  # encoded if weighed
    return support.sentence_values(support.signals(question, texts, cosines, passages, only=tuple(weights),
                                                   reader=reader), weights)
