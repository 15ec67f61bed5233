"""What a generator reads (issue 70, item 3): windows around the evidence within a token budget, and evidence and
"not found" decided on whole passages whether a generator writes the answer or not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import write_jsonl
from gradfuse import SourceSpec, Workspace
from gradfuse.candidate import Candidate, Location
from gradfuse.config import Config
from gradfuse.reading.context import every_sentence, windows
from gradfuse.reading.evidence import Evidence, passage_sentences

FILLER = [f"The {word} section of the manual describes how the {word} layout is drawn on a terminal screen."
          for word in ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")]
FACT = "The default escape character of the session is the tilde, typed at the start of a line."
AFTER = "It can be changed with the -e option when the session starts."


def _evidence(passages: list[Candidate], best: dict[str, float]) -> list[Evidence]:
    """Every sentence of `passages`, valued by `best` (a sentence's text → its value; others 0), best first."""
    scored = [Evidence.of(number, p, span, best.get(p.text[slice(*span)], 0.0))
              for number, p in enumerate(passages, start=1) for span in passage_sentences(p, p.text)]
    return sorted(scored, key=lambda e: -e.score)


def _words(text: str) -> int:
    return len(text.split())


def test_a_window_is_the_best_sentence_with_its_neighbours_even_far_into_a_passage():
    text = " ".join(FILLER[:7] + [FACT, AFTER] + FILLER[7:])
    assert text.index(FACT) > 600  # past what the prompt showed before
    passages = [Candidate("manual", "ssh.1", text, 1.0, 1), Candidate("manual", "ssh_config.5", FILLER[0], 0.5, 2)]
    evidence = _evidence(passages, {FACT: 2.0})
    kept = windows(evidence, passages, _words, budget=50)
    assert list(kept) == [1]  # the second passage's only sentence did not fit: its number is left out
    assert kept[1] == [" ".join([FILLER[6], FACT, AFTER])]  # one window, in the passage's order and words
    assert sum(_words(w) for w in kept[1]) <= 50


def test_windows_are_taken_best_first_until_the_budget_is_spent_and_the_best_always_fits():
    text = " ".join(FILLER[:7] + [FACT, AFTER] + FILLER[7:])
    passages = [Candidate("manual", "ssh.1", text, 1.0, 1)]
    evidence = _evidence(passages, {FACT: 2.0, FILLER[1]: 1.0})
    two = windows(evidence, passages, _words, budget=100)
    assert two[1] == [" ".join(FILLER[0:3]), " ".join([FILLER[6], FACT, AFTER])]  # two windows, document order
    assert windows(evidence, passages, _words, budget=5)[1] == [FACT]  # over budget alone: the best, by itself
    assert windows(evidence, passages, _words, budget=22)[1] == [FACT]  # its neighbours do not fit: it alone


def test_a_window_keeps_lines_as_lines_and_folds_a_man_pages_spacing():
    page = "ESCAPE CHARACTERS\n     When a pseudo-terminal has been requested, ssh supports a number of functions.\n\n" \
           "     The   escape   character   must   always   follow   a   newline   to   be   interpreted."
    passages = [Candidate("manual", "ssh.1", page, 1.0, 1)]
    evidence = _evidence(passages, {})
    text = windows(evidence, passages, _words, budget=100)[1]
    assert text == ["When a pseudo-terminal has been requested, ssh supports a number of functions.\n"
                    "The escape character must always follow a newline to be interpreted."]


def test_text_between_two_sentences_that_was_not_counted_splits_their_window_and_a_table_keeps_its_header():
    code = "\n".join(f"    x{i} = f(x{i - 1})" for i in range(200))  # no sentence: not counted by the budget
    text = f"{FACT}\n\n{code}\n\n{AFTER}"
    passages = [Candidate("manual", "ssh.1", text, 1.0, 1)]
    kept = windows(_evidence(passages, {FACT: 2.0}), passages, _words, budget=30)
    assert kept[1] == [FACT, AFTER]  # two windows, the code between them left out
    table = Candidate("sheet", "costs.csv#0", "Year | Revenue\n2019 | 4.5\n2020 | 5.1", 1.0, 1,
                      location=Location("costs.csv", rows=(1, 2)))
    rows = every_sentence([], [table])  # nothing valued: every row, in order
    assert windows(rows, [table], _words, budget=100)[1] == ["Year | Revenue\n2019 | 4.5\n2020 | 5.1"]
    assert windows(rows[1:], [table], _words, budget=3)[1] == ["Year | Revenue\n2020 | 5.1"]


@pytest.mark.slow
def test_the_generator_reads_the_sentence_that_answers_and_not_found_does_not_depend_on_it(tmp_path):
    long_page = " ".join(FILLER[:7] + [FACT, AFTER] + FILLER[7:])
    rows = [{"id": "ssh", "title": "ssh", "text": long_page},
            {"id": "tmux", "title": "tmux", "text": "The prefix key of tmux is C-b by default, and it can be changed."}]
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("manual", "jsonl", str(write_jsonl(tmp_path / "m.jsonl", rows))))
    question = "What is the default escape character of a session?"
    quoted = ws.ask(question, method="rrf", context_k=2)
    assert quoted.generator == "extractive" and FACT in quoted.text

    from gradfuse.generate import local

    seen = []
    generator = local.load_local_generator("smollm2")
    real = generator.generate
    generator.generate = lambda messages, **options: seen.append(messages) or real(messages, **options)
    ws.config = replace(ws.config, answer="generate")
    try:
        written = ws.ask(question, method="rrf", context_k=2, max_new_tokens=8)
        ws.config = replace(ws.config, context="passages")
        whole = ws.ask(question, method="rrf", context_k=2, max_new_tokens=8)
    finally:
        generator.generate = real
    assert FACT in seen[0][1]["content"]  # a window around the evidence, 700 characters into its passage
    assert long_page in seen[1][1]["content"]  # context "passages": the passage whole
    for answer in (written, whole):  # the same evidence and the same chance, with or without a generator
        assert [(e.passage, e.span) for e in answer.evidence] == [(e.passage, e.span) for e in quoted.evidence]
        assert answer.support == quoted.support and answer.abstained == quoted.abstained
