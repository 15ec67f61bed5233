"""The answer path: the passages' sentences scored as evidence → the chance they hold the answer (support) →
"not found" below `[evidence] abstain_below` → the answer, quoted from the evidence or written by a generator with
its citations.

It may import the query pipeline (query.py), the rest of reading/, rerank/ and generate/, never a shell."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
import time
from dataclasses import dataclass, field, replace

import numpy as np

from gradfuse.candidate import Candidate
from gradfuse.config import Config
from gradfuse.reading.evidence import Evidence, excerpts, extractive_answer, not_found, passage_sentences
from gradfuse.generate import BUNDLED_GENERATOR, Citation, fit_to_window, make_generator, parse_citations
from gradfuse.generate.budget import prompt_room
from gradfuse.generate.prompt import EXTRACTIVE, build_messages
from gradfuse.query import QueryPipeline, SearchResult
from gradfuse.reading.attribution import Statement, attribute, attributed_text, says_nothing, unsupported
from gradfuse.reading.context import every_sentence, text_tokens, windows
from gradfuse.reading.reader import read, read_every
from gradfuse.reading import support
from gradfuse.reading.scoring import EvidenceSettings, score_texts
from gradfuse.rerank.sentences import LM_SENTENCE_SCORERS, within_passes
from gradfuse.rerank.sentences import Passage as SentencePassage
from gradfuse.federation.federated import SourceFailure


@dataclass
class _Prepared:
    """What an answer is made from: the passages, the generator (None: extractive) and its prompt."""

    result: SearchResult
    model: object | None
    messages: list[dict[str, str]]
    dropped: list[Candidate]
    evidence: list[Evidence]  # every sentence of the passages shown, best first
    options: dict
    support: float | None  # the chance that the passages hold the answer (`Workspace.support`)
    abstained: bool  # below `[evidence] abstain_below`: the answer says "not found" and nothing is generated
    within: float | None = None  # a second quoted sentence's value is this close to the first's (support only)
    support_at_least: bool = False  # `support` is a lower bound: the best sentences decided (support.chance)

    def extract(self) -> str:
        quote = not_found if self.abstained else extractive_answer
        return quote(self.evidence, within=self.within, question=self.result.query)


@dataclass
class Answer:
    question: str
    text: str
    citations: list[Citation]
    invalid_citations: list[int]  # numbers the model cited that match no passage
    generator: str
    search: SearchResult  # how the passages were chosen (selection decision, rerank scores)
    timings: dict[str, float] = field(default_factory=dict)
    dropped: list[Candidate] = field(default_factory=list)  # the lowest-ranked, left out to fit the window
    evidence: list[Evidence] = field(default_factory=list)  # the passages' sentences it quotes, best first
    support: float | None = None  # the chance that the passages hold the answer (`Workspace.support`)
    abstained: bool = False  # the evidence was too weak: "not found in these sources", with what came closest
    support_at_least: bool = False  # `support` is a lower bound: the best sentences cleared the threshold alone
    # A written answer's sentences, each with the passages' sentences that support it (reading/attribution.py).
    statements: list[Statement] = field(default_factory=list)
    unsupported: bool = False  # written, and none of its sentences found support in the passages
    written: str | None = None  # the generator's own text (what a stream sent), before its citations were corrected

    @property
    def passages(self) -> list[Candidate]:
        """What the generator saw, numbered from 1."""
        return self.search.candidates[:len(self.search.candidates) - len(self.dropped)]

    @property
    def failures(self) -> list[SourceFailure]:
        return self.search.failures


class Answerer:
    """Answers from what `query` finds; its settings and executor are the pipeline's (one copy of each)."""

    def __init__(self, query: QueryPipeline):
        self.query = query

    @property
    def config(self) -> Config:
        return self.query.config

    def ask(self, question: str, *, generator: str | None = None, context_k: int | None = None,
            max_new_tokens: int | None = None, **search_options) -> Answer:
        prepared = self._prepare(question, generator, context_k, max_new_tokens, search_options)
        started = time.perf_counter()
        text = prepared.extract() if prepared.model is None else prepared.model.generate(prepared.messages,
                                                                                          **prepared.options)
        return self._answer(question, text, prepared, time.perf_counter() - started)

    def ask_stream(self, question: str, *, generator: str | None = None, context_k: int | None = None,
                   max_new_tokens: int | None = None, **search_options) -> Iterator[SearchResult | str | Answer]:
        prepared = self._prepare(question, generator, context_k, max_new_tokens, search_options)
        yield prepared.result
        started = time.perf_counter()
        if prepared.model is None:
            yield (text := prepared.extract())
            yield self._answer(question, text, prepared, time.perf_counter() - started)
            return
        pieces = []
        with closing(prepared.model.stream(prepared.messages, **prepared.options)) as stream:  # closed at once
            for piece in stream:                                                               # when our reader stops
                if piece:
                    pieces.append(piece)
                    yield piece
        yield self._answer(question, "".join(pieces).strip(), prepared, time.perf_counter() - started)

    @property
    def extractive(self) -> bool:
        """Whether an answer with no generator named is the evidence's own sentences (`[generator] answer`)."""
        answer = self.config.answer
        return answer == "extractive" or (answer == "auto" and self.config.generator == BUNDLED_GENERATOR)

    def evidence(self, question: str, passages: list[Candidate], *, settings: EvidenceSettings | None = None,
                 gold: str | None = None, chars: int | None = None) -> list[Evidence]:
        settings = settings or self.config.evidence
        if settings.scorer == "none" or not passages:
            return []
        shown = [c.text[:chars] for c in passages]
        units = [SentencePassage(f"{c.title}: " if c.title else "", text, passage_sentences(c, text))
                 for c, text in zip(passages, shown)]
        if settings.target == "gold" and not gold:
            raise ValueError("[evidence] target 'gold' needs a reference answer (gold)")
        target = gold if settings.target == "gold" else None
        if settings.scorer in LM_SENTENCE_SCORERS:  # on the executor, as stage 2's passes
            units = within_passes(settings.scorer, units, settings.max_lm_passes)
            fit, values = self.query.executor.sentences(settings.scorer, question, units, self.config.rerank,
                                                  target=target, calibrated=settings.calibrated)
            units, passages = units[:fit], passages[:fit]
        scored = [Evidence.of(number, candidate, span, 0.0)
                  for number, (candidate, unit) in enumerate(zip(passages, units), start=1) for span in unit.sentences]
        readings = np.full(len(scored), np.nan)
        if settings.scorer not in LM_SENTENCE_SCORERS:  # read as quoted: a table row with its column names
            encoder = self.query.encoder()
            quoted = [e.quoted() for e in scored]
            numbers = [e.passage for e in scored]
            if settings.scorer == "reader" and scored:
                readings = read_every(question, quoted, settings.reader)
            elif settings.scorer == "support" and support.reads_reader(support.model()) and scored:
                cosines = encoder.encode_short(quoted) @ encoder.encode_query(question)
                overlap = support.signals(question, quoted, cosines, numbers, only=("overlap",))["overlap"]
                readings = read(question, quoted, overlap, cosines)
            values = score_texts(settings.scorer, question, quoted, embed=encoder.encode_short,
                                 query_vector=encoder.encode_query(question), passages=numbers, reader=readings)
        return sorted((replace(e, score=float(value), reading=None if np.isnan(reading) else float(reading))
                       for e, value, reading in zip(scored, values, readings, strict=True)), key=lambda e: -e.score)

    def support(self, question: str, evidence: list[Evidence], decide_at: float | None = None) -> float | None:
        return support.chance(question, evidence, self.query.encoder(), decide_at)[0]

    def _prepare(self, question, generator, context_k, max_new_tokens, search_options) -> _Prepared:
        result = self.query.search(question, k=context_k or self.config.context_k, **search_options)
        extractive = generator is None and self.extractive
        model = None if extractive else make_generator(generator or self.config.generator,
                                                       context_tokens=self.config.context_tokens,
                                                       api_key_env=self.config.api_key_env)
        max_new_tokens = max_new_tokens or self.config.max_new_tokens
        windowed = model is not None and self.config.context != "passages" and self.config.evidence.scorer != "none"
        if model is None or windowed:  # windows are fitted to the room the question leaves (below)
            messages, dropped = [], []
        else:
            messages, dropped = fit_to_window(question, result.candidates, model, max_new_tokens)
        shown = result.candidates[: len(result.candidates) - len(dropped)]
        started = time.perf_counter()
        # On whole passages, generator or not: "not found" and the quotes do not depend on what a generator reads.
        evidence = self.evidence(question, shown, gold=search_options.get("gold"))
        threshold = self.config.evidence.abstain_below
        chance, at_least = support.chance(question, evidence, self.query.encoder(), threshold)
        result.timings["evidence"] = time.perf_counter() - started
        abstained = support.declines(question, evidence, chance, threshold)
        if abstained:  # nothing to answer from: no generator writes one
            model = None
        if model is not None and windowed:
            messages = self._windowed(question, evidence, shown, model, max_new_tokens)
            if not messages:  # no sentence to build windows from (code, lists): whole passages, as many as fit
                messages, dropped = fit_to_window(question, result.candidates, model, max_new_tokens)
                shown = result.candidates[: len(result.candidates) - len(dropped)]
        options = {"max_new_tokens": max_new_tokens, "passages": len(shown) if self.config.cite_first else 0}
        within = support.model().second_within if self.config.evidence.scorer == "support" else None
        return _Prepared(result, model, messages, dropped, evidence, options, chance, abstained, within, at_least)

    def _windowed(self, question: str, evidence: list[Evidence], shown: list[Candidate], model,
                  max_new_tokens: int) -> list[dict[str, str]]:
        """The prompt from what the generator reads of each passage: windows around the evidence (`[generator]
        window_tokens`), or the best sentences alone (context "evidence", `evidence_tokens`), within the room the
        question leaves (fences and titles counted: the budget shrinks until the whole prompt fits); [] where
        there is nothing to read."""
        fits, room = prompt_room(question, model, max_new_tokens)
        count = text_tokens(model)
        budget = min(self.config.evidence_tokens if self.config.context == "evidence" else self.config.window_tokens,
                     room)
        sentences = every_sentence(evidence, shown)
        while True:
            kept = (excerpts(sentences, count, budget) if self.config.context == "evidence"
                    else windows(sentences, shown, count, budget))
            messages = build_messages(question, shown, excerpts=kept) if kept else []
            if not messages or model.count_tokens(messages) <= fits or budget <= 1:
                return messages
            budget = budget * 3 // 4

    def _answer(self, question: str, text: str, prepared: _Prepared, seconds: float) -> Answer:
        result = prepared.result
        answer = Answer(question, text, [], [], prepared.model.name if prepared.model else EXTRACTIVE, result,
                        {**result.timings, "generation": seconds}, prepared.dropped,
                        prepared.evidence[: self.config.evidence.top], prepared.support, prepared.abstained,
                        prepared.support_at_least)
        if prepared.model is not None:
            started = time.perf_counter()
            self._attribute(answer, prepared)
            answer.timings["attribution"] = time.perf_counter() - started
        answer.citations, answer.invalid_citations = parse_citations(answer.text, answer.passages)
        return answer

    def _attribute(self, answer: Answer, prepared: _Prepared) -> None:
        """A written answer cited by what supports each of its sentences; markers alone (`says_nothing`) become the
        quoted sentences, and an answer nothing supports is marked (or says "not found": `[generator] unsupported`)."""
        answer.written = answer.text
        if says_nothing(answer.text, answer.question):
            answer.text = prepared.extract()
            return
        sentences = every_sentence(prepared.evidence, answer.passages)  # LM scorers value the first passages only
        answer.statements = attribute(answer.text, answer.question, sentences, len(answer.passages))
        answer.text = attributed_text(answer.text, answer.statements)
        answer.unsupported = unsupported(answer.statements)
        if answer.unsupported and self.config.unsupported == "not_found":
            answer.text = not_found(prepared.evidence, within=prepared.within, question=answer.question)
