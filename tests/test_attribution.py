"""Written answers cited by what supports them (issue 70, item 4)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import write_jsonl
from gradfuse import SourceSpec, Workspace
from gradfuse.candidate import Candidate
from gradfuse.config import Config
from gradfuse.reading.attribution import attribute, attributed_text, says_nothing, statement_spans, unsupported
from gradfuse.reading.evidence import Evidence, passage_sentences

PASSAGES = [
    "tmux is a terminal multiplexer. The prefix key is C-b by default. It is changed with the prefix option.",
    "The status line shows the session name on the left. Its colour is set with the status-style option.",
    "Windows are numbered from 0. The base-index option makes them start at another number.",
]
QUESTION = "What is the default prefix key of tmux?"


def _evidence() -> list[Evidence]:
    passages = [Candidate("manual", f"tmux.{i}", text, 1.0, i) for i, text in enumerate(PASSAGES, start=1)]
    return [Evidence.of(number, p, span, 0.0) for number, p in enumerate(passages, start=1)
            for span in passage_sentences(p, p.text)]


def _sentences(answer: str) -> list[str]:
    return [answer[a:b] for a, b in statement_spans(answer)]


def test_an_answers_sentences_keep_the_markers_written_after_them():
    assert _sentences("The prefix is C-b [1]. Windows start at 0. [3] Done") == [
        "The prefix is C-b [1].", "Windows start at 0. [3]", "Done"]
    assert _sentences("Use a prefix, e.g. C-b. It is set by Mr. T. Smith [1].") == [
        "Use a prefix, e.g. C-b.", "It is set by Mr. T. Smith [1]."]  # abbreviations and initials end nothing
    assert says_nothing("[2] [3]", QUESTION) and says_nothing("[1, 2].", QUESTION)
    assert says_nothing("[2] tmux[1]", QUESTION)  # the question's own word: nothing it did not know
    assert not says_nothing("C-b [1]", QUESTION) and not says_nothing("Yes, tmux has a prefix key.", QUESTION)
    assert says_nothing("According to passage [2", QUESTION)  # a local model's cite-first frame, and no more
    assert not says_nothing("No [1].", QUESTION)  # an answer, if a short one


def test_a_marker_is_added_where_none_was_written_and_corrected_where_it_names_the_wrong_passage():
    found = attribute("The default prefix key is C-b. Windows are numbered from 0 [2].", QUESTION, _evidence(), 3)
    assert [s.text for s in found] == ["The default prefix key is C-b. [1]", "Windows are numbered from 0 [3]."]
    assert [s.cited for s in found] == [(1,), (3,)] and found[1].written == (2,)
    assert found[0].support[0].text == "The prefix key is C-b by default."
    written = "The default prefix key is C-b.\nWindows are numbered from 0 [2]."
    assert attributed_text(written, attribute(written, QUESTION, _evidence(), 3)) == \
        "The default prefix key is C-b. [1]\nWindows are numbered from 0 [3]."  # its line breaks kept


def test_a_marker_naming_a_supporting_passage_is_kept_and_one_beside_it_naming_another_is_left_out():
    kept = attribute("The prefix key is C-b [1].", QUESTION, _evidence(), 3)[0]
    assert kept.text == "The prefix key is C-b [1]." and kept.cited == (1,)
    mixed = attribute("The prefix key is C-b [1, 2].", QUESTION, _evidence(), 3)[0]
    assert mixed.text == "The prefix key is C-b [1]." and mixed.cited == (1,)


def test_code_indices_are_no_markers_and_the_cite_first_frame_is_no_claim():
    from gradfuse.generate import parse_citations

    shown = [Candidate("manual", f"tmux.{i}", text, 1.0, i) for i, text in enumerate(PASSAGES, start=1)]
    cited, invalid = parse_citations("jq's .[0], f(x)[2], a[1][2] and `t[3]` are code [1].", shown)
    assert [c.number for c in cited] == [1] and not invalid
    found = attribute("The prefix key is `C-b` by default [3].", QUESTION, _evidence(), 3)
    assert found[0].text == "The prefix key is `C-b` by default [1]."
    framed = attribute("According to passage [1], the prefix key is C-b.", QUESTION, _evidence(), 3)[0]
    assert framed.supported and framed.cited == (1,)


def test_a_sentence_with_nothing_to_check_is_left_and_counts_for_nothing():
    found = attribute("No [2]. The prefix key is C-b [1].", QUESTION, _evidence(), 3)
    assert not found[0].checked and found[0].text == "No [2]." and not unsupported(found)
    assert not unsupported(attribute("Yes.", QUESTION, _evidence(), 3))  # nothing said, nothing unsupported
    assert unsupported(attribute("No. It is Ctrl-a in ~/.screenrc.", QUESTION, _evidence(), 3))


def test_a_sentence_joining_two_sentences_of_a_passage_is_supported_by_both():
    found = attribute("The status line shows the session name, coloured by status-style.", QUESTION, _evidence(), 3)
    assert [e.text[:15] for e in found[0].support] == ["The status line", "Its colour is s"]


def test_a_sentence_nothing_supports_is_left_as_written_and_marked():
    found = attribute("The prefix key is Ctrl-a, set in ~/.screenrc [1].", QUESTION, _evidence(), 3)
    assert not found[0].supported and found[0].text == "The prefix key is Ctrl-a, set in ~/.screenrc [1]."
    assert found[0].cited == (1,)  # what was written, for the reader to weigh


@pytest.mark.slow
def test_a_written_answer_cites_what_supports_it_in_the_library_and_the_json(tmp_path):
    from gradfuse.schemas import answer_record

    rows = [{"id": f"tmux{i}", "title": "tmux", "text": text} for i, text in enumerate(PASSAGES)]
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("manual", "jsonl", str(write_jsonl(tmp_path / "m.jsonl", rows))))
    ws.config = replace(ws.config, answer="generate")
    answer = ws.ask(QUESTION, method="rrf", context_k=3, max_new_tokens=40)  # the bundled SmolLM2 writes it
    assert answer.statements and answer.generator == "smollm2"
    for statement in answer.statements:
        if statement.supported:  # every marker of a supported sentence names a passage that supports it
            assert set(statement.cited) <= {e.passage for e in statement.support} | set(
                n for n in statement.cited if any(e.passage == n for e in answer.evidence))
            assert statement.support[0].passage in statement.cited or statement.written
    record = answer_record(answer)
    assert record.unsupported == answer.unsupported == (not any(s.supported for s in answer.statements))
    assert [s.text for s in record.statements] == [s.text for s in answer.statements]
    assert record.answer == " ".join(s.text for s in answer.statements)


@pytest.mark.slow
def test_markers_alone_become_the_quotes_and_an_unsupported_answer_says_not_found_where_set(tmp_path):
    from gradfuse.reading.answering import Answer
    from gradfuse.reading.evidence import NOT_FOUND

    rows = [{"id": f"tmux{i}", "title": "tmux", "text": text} for i, text in enumerate(PASSAGES)]
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("manual", "jsonl", str(write_jsonl(tmp_path / "m.jsonl", rows))))
    prepared = ws.answers._prepare(QUESTION, None, 3, None, {})  # the passages and evidence a writer would get

    def written(text: str) -> Answer:  # what an LLM might write, checked as _answer checks it
        answer = Answer(QUESTION, text, [], [], "an LLM", prepared.result)
        ws.answers._attribute(answer, prepared)
        return answer

    assert written("[2] [3]").text == prepared.extract() == written("[1] tmux [2]").text
    wrong = written("It is Ctrl-a, as in GNU screen.")
    assert wrong.unsupported and wrong.text == "It is Ctrl-a, as in GNU screen."  # marked, left as written
    ws.config = replace(ws.config, unsupported="not_found")
    assert written("It is Ctrl-a, as in GNU screen.").text.startswith(NOT_FOUND)
    assert not written("The prefix key is C-b.").unsupported
