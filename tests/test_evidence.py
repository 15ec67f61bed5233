"""Sentence evidence: passages cut into sentences with their spans, every sentence scored in one pass of the real
scoring LM (or by the baselines), and the answer quoting its evidence in the library, JSON and CLI."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import ASTRONOMY, write_jsonl
from gradfuse import SourceSpec, Workspace
from gradfuse.candidate import Candidate, Location
from gradfuse.cli import app
from gradfuse.config import Config
from gradfuse.reading.evidence import Evidence, extractive_answer, not_found, reads_badly, sentence_spans
from gradfuse.rerank import load_scorer
from gradfuse.rerank.sentences import Passage, passages_that_fit, score_sentences

MOONS = Passage("Mars: ", "Mars is the fourth planet from the Sun. It has two small moons, Phobos and Deimos. "
                          "Its surface is covered in iron oxide dust.", [])


def _split(passage: Passage) -> Passage:
    return Passage(passage.prefix, passage.text, sentence_spans(passage.text))


def test_sentences_keep_their_spans_across_wrapped_lines_and_abbreviations():
    text = "Dr. Smith measured 3.5 km of the\nriver in 1990. The river then\nflooded.\n\n***\n\nA new paragraph starts."
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == ["Dr. Smith measured 3.5 km of the\nriver in 1990.",
                                             "The river then\nflooded.", "A new paragraph starts."]
    chunk = Candidate("notes", "river.md#1", text, 1.0, 1, parent_id="river.md", span=(500, 500 + len(text)))
    evidence = Evidence.of(2, chunk, spans[1], 0.5)
    assert evidence.text == "The river then\nflooded." and evidence.parent_span == (500 + spans[1][0], 500 + spans[1][1])


def _python_manual_page() -> str:
    """Python's own manual page (it ships with the interpreter), as `man` renders it for a terminal."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    page = Path(sys.base_prefix) / "share" / "man" / "man1" / f"python{sys.version_info[0]}.{sys.version_info[1]}.1"
    if not (page.is_file() and shutil.which("man") and shutil.which("col")):
        pytest.skip("no Python manual page or no man(1) to render it (Debian: man-db)")
    rendered = subprocess.run(["man", "--nh", "--nj", "-l", "-P", "cat", str(page)], capture_output=True, text=True,
                              env={**os.environ, "MANWIDTH": "80"}, check=True).stdout
    return subprocess.run(["col", "-bx"], input=rendered, capture_output=True, text=True, check=True).stdout


def test_sentences_of_a_real_manual_page_keep_file_names_options_and_terms_whole():
    text = _python_manual_page()
    spans = sentence_spans(text)
    sentences = [" ".join(text[a:b].split()) for a, b in spans]
    # A dot that opens a file name or sits inside one ends no sentence ("the ." was once a quote).
    assert not [text[a:b] for a, b in spans if text[b - 1] == "." and text[b:b + 1].isalnum()]
    assert "-B Don't write .pyc files on import." in sentences  # an option with its description, one sentence
    assert any(s.startswith("-m module-name Searches sys.path for the named module and runs the corresponding .py "
                            "file as a script.") for s in sentences)
    assert any(s.startswith("PYTHONPATH Augments the default search path") for s in sentences)  # a term, kept
    assert not [s for s in sentences if s.startswith(("NAME", "DESCRIPTION", "COMMAND LINE OPTIONS"))]  # headings
    assert not [s for s in sentences if "PYTHON(1)" in s]  # the page's header and footer lines


def test_sentences_of_real_docstrings_keep_versions_and_cut_code_at_each_prompt():
    import inspect
    import json

    doc = inspect.getdoc(json)
    sentences = [doc[a:b] for a, b in sentence_spans(doc)]
    prompts = [s for s in sentences if s.startswith(">>>")]
    assert len(prompts) >= 10 and all(s.count(">>>") == 1 for s in prompts)  # one interpreter line a unit
    assert any(s.startswith(">>> json.dumps(['foo'") and s.endswith("""'["foo", {"bar": ["baz", null, 1.0, 2]}]'""")
               for s in sentences)  # with the output it printed
    text = "The library was rewritten in version 2.0.1 for xz-utils 5.4.1. Files ending in .tar.gz are read too."
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        "The library was rewritten in version 2.0.1 for xz-utils 5.4.1.", "Files ending in .tar.gz are read too."]


@pytest.mark.slow
def test_every_scorer_gives_one_value_per_sentence_and_calibration_subtracts_the_content_free_gate():
    lm = load_scorer("smollm2")
    passages = [_split(MOONS), _split(Passage("Bread: ", "Bread rises because yeast ferments sugar. It is baked "
                                                        "at high heat for an hour.", []))]
    question = "Which planet has the moons Phobos and Deimos?"
    units = sum(len(p.sentences) for p in passages)
    gate = score_sentences("gate", question, passages, lm=lm)
    content_free = score_sentences("gate", "N/A", passages, lm=lm)  # "N/A" as the query target
    calibrated = score_sentences("gate", question, passages, lm=lm, calibrated=True)
    assert len(gate) == units == 5
    np.testing.assert_allclose(calibrated, gate - content_free, atol=1e-6)  # the shared cache changes nothing
    loo = score_sentences("loo", question, passages, lm=lm)
    upr = score_sentences("upr", question, passages, lm=lm)
    assert len(loo) == len(upr) == units and int(np.argmax(upr)) == 1  # the moons sentence
    with pytest.raises(ValueError, match="unknown sentence scorer"):
        score_sentences("magic", question, passages, lm=lm)


def test_the_passages_one_gate_pass_takes_are_counted_exactly_by_the_packed_tokens():
    lm = load_scorer("smollm2")
    passages = [_split(MOONS)] * 4
    for target in (None, "Mars"):  # query likelihood, and a reference answer after the question
        lengths = [lm.packer.pack_units(passages[:m], question=None if target is None else "Which planet?",
                                        target=target or "Which planet?").length for m in range(1, 5)]
        assert [passages_that_fit(lm, "Which planet?", passages, target, n) for n in lengths] == [1, 2, 3, 4]
        assert [passages_that_fit(lm, "Which planet?", passages, target, n - 1) for n in lengths] == [1, 1, 2, 3]


@pytest.mark.slow
def test_an_answer_quotes_its_evidence_in_the_library_the_json_and_the_cli(tmp_path):
    ws_root = tmp_path / "ws"
    ws = Workspace(Config(workspace=ws_root))
    ws.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(tmp_path / "a.jsonl", ASTRONOMY))))
    answer = ws.ask("Which planet has two moons?", method="rrf", context_k=2, max_new_tokens=8)
    assert 1 <= len(answer.evidence) <= ws.config.evidence.top and "evidence" in answer.timings
    for e in answer.evidence:
        passage = answer.passages[e.passage - 1]
        assert (e.source, e.doc_id) == (passage.source, passage.doc_id)
        assert passage.text[e.span[0]:e.span[1]] == e.text  # a person can check it against the passage
    assert [e.score for e in answer.evidence] == sorted((e.score for e in answer.evidence), reverse=True)
    shown = CliRunner().invoke(app, ["ask", "Which planet has two moons?", "--method", "rrf", "-k", "2",
                                     "--max-new-tokens", "8", "--workspace", str(ws_root), "--json"])
    record = json.loads(shown.output)
    assert record["evidence"] and set(record["evidence"][0]) >= {"passage", "source", "doc_id", "span", "text", "score"}
    printed = CliRunner().invoke(app, ["ask", "Which planet has two moons?", "--method", "rrf", "-k", "2",
                                       "--max-new-tokens", "8", "--workspace", str(ws_root)], terminal_width=200)
    assert "Evidence" in printed.output and "characters" in printed.output


def test_a_sentence_in_two_passages_is_quoted_once_and_the_next_one_takes_its_place():
    def evidence(number: int, text: str, score: float) -> Evidence:
        return Evidence(number, "manuals", f"d{number}", (0, len(text)), text, score)

    twice = "The default value is twenty\nmillion bytes."
    ranked = [evidence(1, twice, 0.9), evidence(2, " ".join(twice.split()), 0.8),
              evidence(2, "It can be changed with --size.", 0.5)]
    assert extractive_answer(ranked) == ("The default value is twenty million bytes. [1] "
                                         "It can be changed with --size. [2]")
    assert not_found(ranked).count("twenty million") == 1


def test_a_label_line_is_quoted_only_with_the_example_after_it():
    text = "Encoding basic Python object hierarchies::\n\n    >>> json.dumps(['foo', {'bar': 1}])\n    '[\"foo\"]'"
    label, example = sentence_spans(text)
    module = Candidate("stdlib", "json#0", text, 1.0, 1)
    ranked = [Evidence.of(1, module, label, 2.0), Evidence(2, "stdlib", "json.dumps#0", (0, 15), "Use json.dumps.", 1.5),
              Evidence.of(1, module, example, 0.4)]
    assert extractive_answer(ranked) == ("Encoding basic Python object hierarchies: >>> json.dumps(['foo', {'bar': 1}]) "
                                         "[1] Use json.dumps. [2]")
    alone = [Evidence.of(1, module, label, 2.0), Evidence(2, "stdlib", "d", (0, 6), "Other.", 1.0)]
    assert extractive_answer(alone) == "Other. [2]"  # a label whose example was not scored is not quoted


def test_examples_synopses_and_headings_are_quoted_only_when_asked_for_or_when_nothing_else_is_left():
    def evidence(number: int, text: str, score: float) -> Evidence:
        return Evidence(number, "man", f"d{number}", (0, len(text)), text, score)

    synopsis = evidence(1, "gzip [ -acdfhklLnNrtvV19 ] [-S suffix] [ name ... ]", 3.0)
    heading = evidence(2, "Net Cash Used In Investing Activities", 2.5)
    shell = evidence(3, "$ echo '{\"json\": 1}' | python -m json.tool", 2.2)
    option = evidence(4, "-k, --keep  Keep (don't delete) input files during compression", 2.0)
    prose = evidence(5, "The default compression level is 6.", 1.0)
    ranked = [synopsis, heading, shell, option, prose]
    assert extractive_answer(ranked, question="How do I keep the input files?") == (
        "-k, --keep Keep (don't delete) input files during compression [4] The default compression level is 6. [5]")
    assert extractive_answer(ranked, question="What is the usage of gzip?").startswith(
        "gzip [ -acdfhklLnNrtvV19 ] [-S suffix] [ name ... ] [1] $ echo")
    assert extractive_answer([heading, synopsis]) == (  # nothing else left: quoted as before
        "Net Cash Used In Investing Activities [2] gzip [ -acdfhklLnNrtvV19 ] [-S suffix] [ name ... ] [1]")
    row = Evidence(1, "prices", "p", (0, 5), "a, b", 1.0, columns=("Date", "Close"))
    assert not reads_badly(row) and not reads_badly(evidence(1, "Version 4.19.0", 1.0))
    for label in ("3.4.1 – Functions and Types", "2.3 Error Handling 12", "kill - send a signal to a process",
                  "gzip, gunzip, zcat - compress or expand files and keep them in step with their originals"):
        assert reads_badly(evidence(1, label, 1.0)), label  # labels what follows, whatever its numbers
    for said in ("The default signal for kill is TERM.", "-s, --signal SIGNAL  send this signal",
                 "3.5 seconds is the default timeout of a connect attempt", "2.3 Error Handling is described below.",
                 "1.5 GB is the largest file it reads"):
        assert not reads_badly(evidence(1, said, 1.0)), said


def test_a_second_sentence_far_below_the_first_is_not_quoted():
    ranked = [Evidence(1, "m", "a", (0, 10), "First one.", 5.0), Evidence(2, "m", "b", (0, 10), "Far below.", 1.0)]
    assert extractive_answer(ranked, within=2.5) == "First one. [1]"
    assert extractive_answer(ranked) == "First one. [1] Far below. [2]"


def test_pdf_footnote_marks_are_left_out_of_quotes_and_the_span_still_points_at_the_text():
    text = "Andrew Kadatch1 and Bob Jenkins2\n1Google Inc.\n2Microsoft Corp."
    page = Candidate("papers", "zip.pdf#0", text, 1.0, 1, location=Location("zip.pdf", page=1))
    quoted = Evidence.of(1, page, (0, len(text)), 1.0)
    assert quoted.quoted() == "Andrew Kadatch and Bob Jenkins Google Inc. Microsoft Corp." and quoted.text == text
    sizes = "It needs 2Gb of RAM, md5 sums and a 3Com card.\n1Department of Energy"
    assert Evidence.of(1, replace(page, text=sizes), (0, len(sizes)), 1.0).quoted() == \
        "It needs 2Gb of RAM, md5 sums and a 3Com card. Department of Energy"
    library = Candidate("papers", "asn.pdf#0", "GNU Libtasn1 reads DER.", 1.0, 1, location=Location("asn.pdf", page=2))
    assert Evidence.of(1, library, (0, 23), 1.0).quoted() == "GNU Libtasn1 reads DER."  # no footnote: kept whole
    plain = Candidate("notes", "a.md", text, 1.0, 1)
    assert "Kadatch1" in Evidence.of(1, plain, (0, len(text)), 1.0).quoted()  # only a PDF's text layer glues them


def test_a_table_row_holding_the_key_a_question_names_is_a_lookup():
    from gradfuse.reading.support import looked_up

    row = Evidence(1, "market", "prices.csv#0", (0, 24), "2003-09-19 | 29.76 | 29.96", 0.0,
                   columns=("Date", "Open", "Close"))
    assert looked_up("closing price on 2003-09-19", [row])
    assert not looked_up("closing price on 2003-09-18", [row])
    assert not looked_up("price on 2003-09-19", [replace(row, columns=())])  # prose is left to the model
    assert not looked_up("When was Debian 10 released?", [replace(row, text="10 | buster | 2019-07-06")])
    assert not looked_up("Which utf-8 option?", [replace(row, text="utf-8 | 1 | 2")])  # no digits either side
    prose = Evidence(2, "notes", "a.md", (0, 20), "Prices fell on 2003-09-19.", 1.0)
    assert not looked_up("closing price on 2003-09-19", [prose, row])  # the row is not what the answer quotes


@pytest.mark.slow
def test_extractive_answers_and_evidence_contexts_keep_the_passage_numbers(tmp_path):
    ws = Workspace(Config(workspace=tmp_path / "ws"))  # answer "auto" with the bundled generator: extractive
    ws.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(tmp_path / "a.jsonl", ASTRONOMY))))
    answer = ws.ask("Which planet has two moons?", method="rrf", context_k=3)
    assert answer.generator == "extractive" and answer.citations and not answer.invalid_citations
    assert ws.ask("Which planet has two moons?", method="rrf", context_k=3, generator="smollm2",
                  max_new_tokens=4).generator == "smollm2"  # a generator named: it writes the answer
    quoted = answer.evidence[0]
    assert answer.text.startswith(f"{quoted.text} [{quoted.passage}]")  # the sentence itself, nothing generated
    streamed = list(ws.ask_stream("Which planet has two moons?", method="rrf", context_k=3))
    assert streamed[-1].text == answer.text

    ws.config = replace(ws.config, answer="generate", context="evidence", evidence_tokens=20)
    from gradfuse.generate import local

    seen = []
    generator = local.load_local_generator("smollm2")
    real = generator.generate
    generator.generate = lambda messages, **options: seen.append(messages) or real(messages, **options)
    try:
        generated = ws.ask("Which planet has two moons?", method="rrf", context_k=3, max_new_tokens=8)
    finally:
        generator.generate = real
    prompt = seen[0][1]["content"]
    best = generated.evidence[0]
    assert f"<passage id={best.passage} " in prompt and best.text in prompt
    assert prompt.count("<passage id=") < 3  # passages with no kept sentence are left out, numbers kept


@pytest.mark.parametrize("near_a_window_end", [False, True])
def test_a_long_passage_goes_to_pysbd_in_windows_and_gets_pysbds_own_sentences(monkeypatch, near_a_window_end):
    """pysbd's time grows with the square of its input (400 KB took 211 s): it is given at most PYSBD_WINDOW
    characters at a time, and the windows cost no sentence: the spans are those of pysbd over the whole text, also
    where a window would end inside "Dr. Smith" (the review of round 5 found windows cut there)."""
    from gradfuse.reading import evidence

    words = ["delta", "Dr.", "clay", "3.5 mm", "river", "e.g.", "sand", "(layer 4)", "U.S.", "silt"]
    sentences = [f"Sample {i} of the {words[i % 10]} core holds {words[(i * 3) % 10]} and {words[(i * 7) % 10]}."
                 for i in range(300)]
    text = " ".join(sentences)  # about 15,000 characters in one paragraph
    if near_a_window_end:
        filler = "The committee reviewed the proposal in great detail and discussed its merits at length today. "
        text = filler * 40 + "The report was prepared by Dr. Smith and his team at the institute " + \
            "over many long months of work " * 20 + "in the end. " + filler * 5
        assert evidence.PYSBD_WINDOW - 300 < text.find("Dr.") < evidence.PYSBD_WINDOW
    with monkeypatch.context() as whole_text:
        whole_text.setattr(evidence, "PYSBD_WINDOW", len(text))
        whole = evidence.split_sentences(text)
    segmenter, given = evidence._segmenter(), []
    real_processor = segmenter.processor
    monkeypatch.setattr(segmenter, "processor", lambda piece: given.append(len(piece)) or real_processor(piece))
    spans = evidence.split_sentences(text)
    assert len(given) >= 2 and max(given) <= evidence.PYSBD_WINDOW and sum(given) < 2 * len(text)
    assert spans == whole and len(spans) >= len(text) // 300


def test_pysbd_is_asked_only_where_a_piece_may_hold_two_sentences_and_its_spans_are_its_own(monkeypatch):
    """Two shortcuts of the evidence step (issue 70: it was most of an answer's time) change no sentence: a piece
    with nothing that may end a sentence before its last character is one sentence without asking pysbd, and
    pysbd's sentences are placed by str.find where its char_span mode compiled each into a pattern."""
    import pysbd

    from gradfuse.reading import evidence

    text = _python_manual_page()
    own = pysbd.Segmenter(language="en", clean=False, char_span=True)
    asked: list[str] = []
    real = evidence._pysbd_segments
    monkeypatch.setattr(evidence, "_pysbd_segments", lambda piece: asked.append(piece) or real(piece))
    spans = evidence.split_sentences(text)
    shortened = len(asked)
    monkeypatch.setattr(evidence, "_MAY_CUT", re.compile(r"(?s)."))  # every piece to pysbd, as before
    assert evidence.split_sentences(text) == spans
    assert 0 < shortened < len(asked) - shortened  # fewer pieces were asked
    for piece in asked:  # placed as pysbd places them
        assert [(a, b) for a, b in evidence._located(own.processor(piece).process(), piece)] == \
            [(s.start, s.end) for s in own.segment(piece)]


def test_sentence_spans_are_kept_by_a_digest_of_the_text_not_the_text(monkeypatch):
    from gradfuse.reading import evidence

    text = "Mars has two moons. Phobos is the larger one of the two. Deimos is small and far out."
    first = sentence_spans(text)
    monkeypatch.setattr(evidence, "split_sentences", lambda _: pytest.fail("split again"))
    assert sentence_spans(text) == first and len(first) == 3
    assert all(isinstance(key, bytes) and text not in repr(key) for key in evidence._spans)


def test_not_found_is_decided_on_the_best_sentences_where_the_rest_cannot_change_it(tmp_path):
    """The chance that the passages answer rises with the best cosine: where the best sentences already clear the
    threshold, the others are not encoded (issue 70: encoding them was most of an answer's time); the decision is
    the one every sentence gives, the chance a lower bound of it. Below the threshold every sentence is read."""
    from gradfuse.reading import support

    ws = Workspace(Config(workspace=tmp_path / "ws"))
    threshold = ws.config.evidence.abstain_below
    passages = [Candidate("notes", f"n{i}", text, 1.0, i + 1) for i, text in enumerate([
        "Mars is the fourth planet from the Sun. It has two small moons, Phobos and Deimos. Its surface is covered "
        "in iron oxide dust, which gives it a red colour. Olympus Mons is its highest volcano.",
        "Jupiter is the largest planet. It has dozens of moons, the four largest found by Galileo in 1610. Its "
        "Great Red Spot is a storm larger than the Earth.",
        "Bread rises because yeast makes carbon dioxide. The dough is kneaded, left to rise and baked in a hot oven."])]
    encoder = ws.query.encoder()
    assert support.decides_early(support.model())
    for question, answered in (("What are the names of the moons of Mars?", True),
                               ("At what temperature does tungsten melt?", False)):
        evidence = ws.evidence(question, passages)
        encoder.clear_query_cache()
        encoder.encode_query(question)
        early = ws.support(question, evidence, decide_at=threshold)
        encoded_early = len(encoder._short) - 1
        whole = ws.support(question, evidence)
        assert (early >= threshold) == (whole >= threshold) == answered
        assert early <= whole + 1e-6
        assert encoded_early == (support.FIRST_ENCODED if answered else len(evidence))
    # An answer says where its support is a lower bound: in the library, the JSON and the CLI.
    ws.index(SourceSpec("planets", "jsonl", str(write_jsonl(tmp_path / "planets.jsonl", [
        {"id": f"p{i}", "text": p.text} for i, p in enumerate(passages)]))))
    answer = ws.ask("What are the names of the moons of Mars?")
    assert not answer.abstained and answer.support_at_least and answer.support >= threshold
    from gradfuse.schemas import answer_record

    assert answer_record(answer).support_at_least
    shown = CliRunner().invoke(app, ["ask", "What are the names of the moons of Mars?", "--workspace",
                                     str(tmp_path / "ws")], env={"COLUMNS": "200"})
    assert f"support ≥ {answer.support:.2f}" in shown.output
    declined = ws.ask("At what temperature does tungsten melt?")
    assert declined.abstained and not declined.support_at_least
