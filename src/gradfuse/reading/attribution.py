"""Citations a written answer earns: each of its sentences is matched to the passages' sentences that support it.

An LLM's own markers were no guide (issue 70: of 80 answers from a 0.5B model, 34 cited nothing and 19 were
markers alone). A sentence of the answer is supported by a sentence of the passages (or that sentence with the
next one, where the answer joins two) holding at least `SUPPORTED` of what it adds to the question: its content
words that the question does not hold (all its content words where it only restates the question). Its markers are
then kept where they name a supporting passage, corrected where they name another, and added where it has none; a
sentence nothing supports keeps what it was written with and is marked. A sentence with no content word to check
("No.", "Yes [1].") is left as written and counts for nothing. A word held is evidence of support, not proof of
it: an answer that negates its passage still reads as supported. Words are Latin-script (`support.content_words`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gradfuse.generate.prompt import CITATION_MARKER
from gradfuse.reading.evidence import Evidence
from gradfuse.reading.support import content_words

SUPPORTED = 0.5  # of a sentence's new content words one passage sentence (or two in a row) must hold
# Words of the frame a local model is made to open with (generate/local.py's cite-first prefix), never a claim.
FRAME_WORDS = frozenset(content_words("According to passage yes"))  # and a bare "yes"
# An answer's sentences end at an end mark (with the markers written after it) before what opens the next one,
# but not after a common abbreviation or a lone initial.
_END = re.compile(r"(?<=[.!?])((?:\s*\[\d+(?:\s*,\s*\d+)*\])*)(\s+)(?=[\"'(‘“]?[A-Z0-9])")
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf|Mr|Mrs|Ms|Dr|St|No|Fig|approx)|\b[A-Z](?:\.[A-Z])*)\.$")
_ANSWER_WORDS = re.compile(r"\b(yes|no|not|never|none)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Statement:
    """One sentence of a written answer and what supports it."""

    text: str  # as it reads in the final answer (markers corrected or added)
    cited: tuple[int, ...]  # the passage numbers its markers name now
    support: tuple[Evidence, ...]  # the passages' sentences that hold what it says, best first; () unsupported
    written: tuple[int, ...] = ()  # the numbers its writer put on it (those that name a passage)
    checked: bool = True  # it has content words to look for (False: "No.", "Yes [1]."; never unsupported)

    @property
    def supported(self) -> bool:
        return bool(self.support)


def statement_spans(answer: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of a written answer, each with the markers written after its end mark."""
    spans, start = [], 0
    for cut in _END.finditer(answer):
        if _ABBREVIATION.search(answer[start:cut.start(1)]):
            continue
        spans.append((start, cut.end(1)))
        start = cut.end()
    spans.append((start, len(answer)))
    return [(a, b) for a, b in spans if answer[a:b].strip()]


def _markers(text: str) -> list[re.Match]:
    return [m for m in CITATION_MARKER.finditer(text) if m.group(2)]


def _unmarked(text: str) -> str:
    """`text` without its markers, and without a marker a model began and never closed ("passage [2")."""
    return re.sub(r"\[\d*$", " ", CITATION_MARKER.sub(lambda m: m.group(1) or " ", text).rstrip())


def says_nothing(answer: str, question: str) -> bool:
    """Whether an answer is citation markers with at most a few of the question's own words ("[2] [3]", "[2]
    sqlite[1]", "According to passage [2"): nothing to read, nothing to check. "No [1]." says something."""
    text = _unmarked(answer)
    return (len(text.split()) < 5 and not _ANSWER_WORDS.search(text)
            and not set(content_words(text)) - set(content_words(question)) - FRAME_WORDS)


def attribute(answer: str, question: str, evidence: list[Evidence], passages: int) -> list[Statement]:
    """Each sentence of `answer` with its support among `evidence` (every sentence of the `passages` numbered
    passages the answer read, best first) and its markers set to the passages that support it."""
    asked = set(content_words(question)) | FRAME_WORDS
    found = []
    for start, end in statement_spans(answer):
        sentence = answer[start:end].strip()
        written = tuple(dict.fromkeys(int(n) for m in _markers(sentence) for n in m.group(2).split(",")
                                      if 1 <= int(n) <= passages))
        words = set(content_words(_unmarked(sentence)))
        if not words - FRAME_WORDS:  # "No.", "Yes [1].": nothing to look for
            found.append(Statement(sentence, written, (), written, checked=False))
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
    the sentence's end mark. A sentence nothing supports is left as written. Its support is that of the best of
    the passages it cites."""
    if not support:
        return Statement(sentence, written, (), written)
    best = max(support, key=lambda n: support[n][1])
    if not written:
        return Statement(f"{sentence} [{best}]", (best,), support[best][0], written)
    kept = tuple(n for n in written if n in support)
    if kept == written:
        return Statement(sentence, written, support[max(kept, key=lambda n: support[n][1])][0], written)
    first = True

    def rewritten(marker: re.Match) -> str:
        nonlocal first
        if marker.group(1):  # a code span
            return marker.group(0)
        numbers = [n for n in (int(x) for x in marker.group(2).split(",")) if n in support]
        if not numbers and not kept and first:
            numbers = [best]
        first = False
        return f"[{', '.join(map(str, numbers))}]" if numbers else ""

    text = re.sub(r"[ \t]+(?=[.,;:!?]|$)", "", CITATION_MARKER.sub(rewritten, sentence))  # a removed marker's space
    cited = kept or (best,)
    return Statement(text, cited, support[max(cited, key=lambda n: support[n][1])][0], written)


def attributed_text(answer: str, found: list[Statement]) -> str:
    """`answer` with each sentence as attributed, its line breaks and spacing between sentences kept."""
    spans = statement_spans(answer)
    if len(spans) != len(found):
        return " ".join(s.text for s in found)
    pieces, position = [], 0
    for (start, end), statement in zip(spans, found):
        pieces += [answer[position:start], statement.text]
        position = end
    return "".join(pieces) + answer[position:]


def unsupported(found: list[Statement]) -> bool:
    """Whether an answer says something and none of it found support."""
    checked = [s for s in found if s.checked]
    return bool(checked) and not any(s.supported for s in checked)
