"""Citations a written answer earns: each of its sentences is matched to the passages' sentences that support it.

An LLM's own markers were no guide (issue 70: of 80 answers from a 0.5B model, 34 cited nothing and 19 were
markers alone). A sentence of the answer is supported by a sentence of the passages (or that sentence with the
next one, where the answer joins two) holding at least `SUPPORTED` of what it adds to the question: its content
words that the question does not hold (all its content words where it only restates the question). Its markers are
then kept where they point at a supporting passage, corrected where they point elsewhere, and added where it has
none; a sentence nothing supports keeps what it was written with and is marked. A word held is evidence of
support, not proof of it: an answer that negates its passage still reads as supported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gradfuse.reading.evidence import Evidence
from gradfuse.reading.support import content_words

SUPPORTED = 0.5  # of a sentence's new content words one passage sentence (or two in a row) must hold
_MARKERS = re.compile(r"\s*\[(\d+(?:\s*,\s*\d+)*)\]")
# An answer's sentences: cut after an end mark (and the markers that follow it) before what opens the next one.
_SENTENCE_END = re.compile(r"(?<=[.!?])((?:\s*\[\d+(?:\s*,\s*\d+)*\])*)\s+(?=[\"'(‘“]?[A-Z0-9])")


@dataclass(frozen=True)
class Statement:
    """One sentence of a written answer and what supports it."""

    text: str  # as it reads in the final answer (markers corrected or added)
    cited: tuple[int, ...]  # the passage numbers its markers name now
    support: tuple[Evidence, ...]  # the passages' sentences that hold what it says, best first; () unsupported
    written: tuple[int, ...] = ()  # the numbers its writer put on it (those that name a passage)

    @property
    def supported(self) -> bool:
        return bool(self.support)


def statements(answer: str) -> list[str]:
    """The sentences of a written answer, each with the markers written after its end mark."""
    pieces, start = [], 0
    for cut in _SENTENCE_END.finditer(answer):
        pieces.append(answer[start:cut.end(1)].strip())
        start = cut.end()
    return [p for p in (*pieces, answer[start:].strip()) if p]


def says_nothing(answer: str, question: str) -> bool:
    """Whether an answer is citation markers with at most a few of the question's own words ("[2] [3]", "[2]
    sqlite[1]"): nothing to read, nothing to check."""
    text = _MARKERS.sub(" ", answer)
    return len(text.split()) < 4 and not set(content_words(text)) - set(content_words(question))


def attribute(answer: str, question: str, evidence: list[Evidence], passages: int) -> list[Statement]:
    """Each sentence of `answer` with its support among `evidence` (every sentence of the `passages` numbered
    passages the answer read) and its markers set to the passages that support it."""
    asked = set(content_words(question))
    found = []
    for sentence in statements(answer):
        plain = _MARKERS.sub("", sentence).strip()
        written = tuple(dict.fromkeys(int(n) for m in _MARKERS.finditer(sentence) for n in m.group(1).split(",")
                                      if 1 <= int(n) <= passages))
        words = set(content_words(plain))
        if not words:  # "Yes." or markers alone: nothing to check, nothing to cite
            found.append(Statement(sentence, written, (), written))
            continue
        found.append(_cited(sentence, written, supporting(words - asked or words, evidence)))
    return found


def supporting(words: set[str], evidence: list[Evidence]) -> dict[int, tuple[tuple[Evidence, ...], float]]:
    """Passage number → its best support for `words`: the sentence (or two sentences in a row) holding the largest
    share of them, and that share, for each passage where it is at least `SUPPORTED`."""
    held = {id(e): set(content_words(e.quoted())) for e in evidence}
    following = _next_sentences(evidence)
    best: dict[int, tuple[tuple[Evidence, ...], float]] = {}
    # Single sentences first, then pairs: a tie goes to one sentence, then to the one the evidence step valued more.
    options = [(e,) for e in evidence] + [(e, following[id(e)]) for e in evidence if id(e) in following]
    for option in options:
        share, passage = len(words & set().union(*(held[id(o)] for o in option))) / len(words), option[0].passage
        if share >= SUPPORTED and share > best.get(passage, ((), 0.0))[1] + 1e-9:
            best[passage] = (option, share)
    return best


def _next_sentences(evidence: list[Evidence]) -> dict[int, Evidence]:
    by_passage: dict[int, list[Evidence]] = {}
    for e in evidence:
        by_passage.setdefault(e.passage, []).append(e)
    following = {}
    for sentences in by_passage.values():
        sentences.sort(key=lambda e: e.span)
        following.update({id(a): b for a, b in zip(sentences, sentences[1:])})
    return following


def _cited(sentence: str, written: tuple[int, ...],
           support: dict[int, tuple[tuple[Evidence, ...], float]]) -> Statement:
    """`sentence` with markers naming only passages that support it: markers naming others are left out, and where
    none is left the first becomes the best-supporting passage's; where none was written, that one is added after
    the sentence's end mark. A sentence nothing supports is left as written."""
    if not support:
        return Statement(sentence, written, (), written)
    best = max(support, key=lambda n: support[n][1])
    if not written:
        return Statement(f"{sentence} [{best}]", (best,), support[best][0], written)
    kept = tuple(n for n in written if n in support)
    if kept == written:
        return Statement(sentence, written, support[best][0], written)
    first = True

    def rewritten(marker: re.Match) -> str:
        nonlocal first
        numbers = [n for n in (int(x) for x in marker.group(1).split(",")) if n in support]
        if not numbers and not kept and first:
            numbers = [best]
        first = False
        space = marker.group(0)[:len(marker.group(0)) - len(marker.group(0).lstrip())]
        return f"{space}[{', '.join(map(str, numbers))}]" if numbers else ""

    return Statement(_MARKERS.sub(rewritten, sentence), kept or (best,), support[best][0], written)


def attributed_text(found: list[Statement]) -> str:
    return " ".join(s.text for s in found)
