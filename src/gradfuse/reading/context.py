"""What a generator reads of the passages (`[generator] context`): windows around the evidence by default.

The prompt used to show each passage's first 600 characters, so a fact later in a passage never reached the LLM
(issue 70: inside what it read for 34 of 47 questions whose passages held it for 43). A window is a sentence the
evidence step ranked high with its neighbours in its passage, in the passage's own words; windows are taken best
first until the token budget is spent, and a passage shows its windows in document order under its own number
(so citations still map back). The evidence itself is decided on whole passages, generator or not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from gradfuse.candidate import Candidate
from gradfuse.reading.evidence import Evidence, is_table, passage_sentences

NEIGHBOURS = 1  # sentences either side of a chosen one: the sentence that names what a chosen one's "it" means
JOINED_GAP = 40  # characters between two sentences a window shows as one run (more: a code block, a table)
_SPACES = re.compile(r"[ \t]+")
_LINE_BREAKS = re.compile(r"[ \t]*\n\s*")  # with the indent after it and any blank lines


def windows(evidence: list[Evidence], passages: list[Candidate], count_tokens: Callable[[str], int], budget: int,
            neighbours: int = NEIGHBOURS) -> dict[int, list[str]]:
    """Passage number → its windows' text in document order: the best sentences (`evidence`, best first, every
    sentence of the passages) each with `neighbours` sentences either side, added while they fit `budget` tokens
    (the best sentence always). Consecutive sentences are one window, quoted from the passage as written (white
    space folded)."""
    order: dict[int, list[Evidence]] = {}
    for sentence in evidence:
        order.setdefault(sentence.passage, []).append(sentence)
    for sentences in order.values():
        sentences.sort(key=lambda e: e.span)
    position = {(e.passage, e.span): i for sentences in order.values() for i, e in enumerate(sentences)}
    kept: dict[int, set[int]] = {}
    used = 0
    for sentence in evidence:  # best first
        index = position[(sentence.passage, sentence.span)]
        around = range(max(0, index - neighbours), min(len(order[sentence.passage]), index + neighbours + 1))
        new = [i for i in around if i not in kept.get(sentence.passage, set())]
        if not new:
            continue
        alone = [index] if index in new else []
        for choice in (new, alone):  # with its neighbours, else alone; the best sentence in any case
            cost = sum(count_tokens(order[sentence.passage][i].text) for i in choice)
            if choice and (used + cost <= budget or (not kept and choice is alone)):
                kept.setdefault(sentence.passage, set()).update(choice)
                used += cost
                break
    return {number: _runs(passages[number - 1], order[number], sorted(indices))
            for number, indices in sorted(kept.items())}


def _runs(passage: Candidate, sentences: list[Evidence], indices: list[int]) -> list[str]:
    """The text of each run of consecutive sentences, from the first one's start to the last one's end (two
    sentences with more than `JOINED_GAP` characters between them, which were not counted, are two runs); a table's
    header row opens its first run (a row's values alone say nothing)."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][-1] == index - 1 and \
                sentences[index].span[0] - sentences[index - 1].span[1] <= JOINED_GAP:
            runs[-1].append(index)
        else:
            runs.append([index])
    shown = [_folded(passage.text[sentences[run[0]].span[0]:sentences[run[-1]].span[1]]) for run in runs]
    if is_table(passage) and shown:
        shown[0] = f"{passage.text.split(chr(10), 1)[0]}\n{shown[0]}"
    return shown


def _folded(text: str) -> str:
    """Runs of spaces as one, indents and blank lines left out (lines stay lines: a table's rows): a man page's or a
    PDF's layout costs tokens."""
    return _SPACES.sub(" ", _LINE_BREAKS.sub("\n", text)).strip()


def every_sentence(evidence: list[Evidence], passages: list[Candidate]) -> list[Evidence]:
    """`evidence` (best first), then every sentence of a passage it did not value (an LM scorer values the first
    passages only), in passage order: what windows are built from and an answer is checked against."""
    valued = {e.passage for e in evidence}
    return evidence + [Evidence.of(number, p, span, float("-inf")) for number, p in enumerate(passages, start=1)
                       if number not in valued for span in passage_sentences(p, p.text)]


def text_tokens(generator) -> Callable[[str], int]:
    """A text's length in `generator`'s tokens as its prompt counts them (an endpoint's count is an estimate), each
    text counted once however often windows weigh it (a sentence is its neighbours' neighbour; a budget that shrinks
    weighs them all again)."""
    empty = generator.count_tokens([{"role": "user", "content": ""}])
    return cache(lambda text: max(1, generator.count_tokens([{"role": "user", "content": text}]) - empty))
