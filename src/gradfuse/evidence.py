"""Sentence evidence: the record of one scored sentence of a passage the generator saw, next to the candidate
record (never extra fields on it), and how passages are cut into sentences.

A sentence is kept by its character span in the passage's text, and so in the parent document where the passage
is a chunk of one: a person can check every quoted sentence against its source.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from gradfuse.candidate import Candidate


@dataclass(frozen=True)
class Evidence:
    passage: int  # the passage's number in the prompt, from 1 ([n] in the answer)
    source: str
    doc_id: str
    span: tuple[int, int]  # characters of the passage's text
    text: str
    score: float  # the evidence scorer's value (higher is more needed), comparable within one answer only
    parent_span: tuple[int, int] | None = None  # characters of the parent document, for a chunk of one

    @classmethod
    def of(cls, number: int, passage: Candidate, span: tuple[int, int], score: float) -> Evidence:
        start, end = span
        parent = (passage.span[0] + start, passage.span[0] + end) if passage.span else None
        return cls(number, passage.source, passage.doc_id, span, passage.text[start:end], float(score), parent)


_SPLITTING = threading.Lock()  # pysbd's segmenter keeps state between calls


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=True)


_WRAPPED = re.compile(r"(?<!\n)\n(?!\n)")  # a line break inside a paragraph (hard-wrapped text, Markdown)
_WORD = re.compile(r"[^\W\d_]{2,}")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of `text` (pysbd, rule-based: abbreviations, decimals, quotes), without
    the white space around them. A single line break does not end a sentence (pysbd's own cleaning, which would,
    moves the offsets; a space of the same length keeps them). Pieces of fewer than three words (a rule of
    asterisks, the stub a passage's cut leaves) are not sentences."""
    unwrapped = _WRAPPED.sub(" ", text)
    with _SPLITTING:
        pieces = _segmenter().segment(unwrapped) if text.strip() else []
    spans = []
    for piece in pieces:
        start, end = piece.start, piece.end
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if len(_WORD.findall(text[start:end])) >= 3:
            spans.append((start, end))
    return spans


EXTRACTIVE_SENTENCES = 2  # sentences an extractive answer quotes


def extractive_answer(evidence: list[Evidence], sentences: int = EXTRACTIVE_SENTENCES) -> str:
    """The best evidence sentences themselves as the answer, each with its passage's number: nothing generated,
    so nothing is made up."""
    return " ".join(f"{e.text} [{e.passage}]" for e in evidence[:sentences]) or \
        "The passages hold no sentence to answer from."


def excerpts(evidence: list[Evidence], count_tokens: Callable[[str], int], budget: int) -> dict[int, list[str]]:
    """The best sentences that fit `budget` tokens (the first always), grouped by passage, in document order:
    what a generator reads instead of whole passages."""
    kept, used = [], 0
    for sentence in evidence:  # best first
        tokens = count_tokens(sentence.text)
        if kept and used + tokens > budget:
            continue
        kept.append(sentence)
        used += tokens
    grouped: dict[int, list[str]] = {}
    for sentence in sorted(kept, key=lambda e: (e.passage, e.span)):
        grouped.setdefault(sentence.passage, []).append(sentence.text)
    return grouped
