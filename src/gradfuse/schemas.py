"""Typed JSON views of the library's results: what `--json` prints and what the HTTP API returns (one shape).

Pydantic models give the server its OpenAPI schema; `search_record` and `answer_record` build them from the
library's dataclasses. Non-finite numbers (a source with no candidates has relevance -inf) become null, since
JSON has no infinity.
"""

from __future__ import annotations

import math
from typing import Any
from dataclasses import asdict
from pathlib import Path

from pydantic import BaseModel, Field

from gradfuse.candidate import Candidate, Location
from gradfuse.reading.evidence import Evidence
from gradfuse.generate import describe_generator
from gradfuse.redact import redact
from gradfuse.sources.base import SourceStats
from gradfuse.federation.federated import SourceFailure
from gradfuse.workspace import Answer, SearchResult


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class CopyRecord(BaseModel):
    """Another copy of the same text, merged into the candidate (its provenance is kept)."""

    source: str
    doc_id: str
    native_rank: int
    native_score: float


class LocationRecord(BaseModel):
    """Where a passage read from a file stands in it."""

    file: str
    page: int | None = None
    slide: int | None = None
    sheet: str | None = None
    rows: tuple[int, int] | None = Field(None, description="the spreadsheet's own row numbers, first and last")
    headings: list[str] = Field(default_factory=list, description="the section path, outermost first")
    cited_as: str = Field(description='as a citation shows it: "report.pdf · p. 12 · 3.2 Results"')


def evidence_record(evidence: Evidence) -> EvidenceRecord:
    return EvidenceRecord(**{**asdict(evidence), "location": location_record(evidence.location)})


def location_record(location: Location | None) -> LocationRecord | None:
    if location is None:
        return None
    return LocationRecord(**{**asdict(location), "headings": list(location.headings)}, cited_as=location.describe())


class CandidateRecord(BaseModel):
    key: str = Field(description="source/doc_id: unique across sources")
    source: str
    doc_id: str
    title: str
    text: str
    native_score: float = Field(description="what the source itself scored (BM25, cosine, run score)")
    native_rank: int = Field(description="1-based rank inside its source")
    parent_id: str | None = None
    span: tuple[int, int] | None = None
    cut_from: int | None = Field(None, description="the text's length at its source, where it was longer than "
                                                   "[guard] max_passage_chars and was cut to that")
    location: LocationRecord | None = Field(None, description="page, slide, sheet and rows, headings (files)")
    score_kind: str = Field("", description='how an engine made native_score, higher better: "cosine", "-l2" '
                                            '(a distance negated), "bm25", "rrf", "1/rank"; "" for a gradfuse index')
    metadata: dict[str, Any] = Field(default_factory=dict, description="the engine's fields named by metadata_fields")
    scores: dict[str, float | None] = Field(description="every later score: fusion:<method>, prior, rerank:*")
    merged: list[CopyRecord] = Field(description="copies of the same text from other sources or ranks")


class FailureRecord(BaseModel):
    source: str
    reason: str = Field(description="timeout | error | busy (its workers held by late calls) | open (its circuit "
                                    "breaker: not called)")
    detail: str


class SourceStepRecord(BaseModel):
    source: str
    gain: float
    relevance: float
    penalty: float = Field(description="lambda x redundancy with the sources chosen before it")


class SelectionRecord(BaseModel):
    chosen: list[SourceStepRecord] = Field(description="in the order stage 1 added them")
    dropped: dict[str, str] = Field(description="source -> why it was not chosen")
    relevance: dict[str, float | None]


class RoutingRecord(BaseModel):
    router: str = Field(description="summary (GRO-RAG selection on the sources' summaries) or redde")
    budget: int = Field(description="sources a routed question is sent to ([routing] budget)")
    widened: int = Field(0, description="sources asked beyond the budget: their summary scores were within "
                                        "[routing] widen_margin of the best (the summaries could not tell them apart)")
    asked: list[str] = Field(description="the sources the question was sent to")
    unscored: dict[str, str] = Field(description="sources asked without a summary to judge them by, and why")
    skipped: dict[str, str] = Field(description="source -> why it was not asked")


class RerankRecord(BaseModel):
    scorer: str = Field(description="gradient, loo, loo-greedy, upr, relevance or cross-encoder")
    score_key: str = Field(description="the candidate score it ranks by, before the mix with the prior")
    target: str | None = Field(description="the text whose likelihood was scored (LM target scorers)")
    loss: float | None = Field(description="loss of the target given the full packed context, where computed")
    seconds: float
    target_seconds: float


class SearchRecord(BaseModel):
    query: str
    method: str
    candidates: list[CandidateRecord]
    failures: list[FailureRecord] = Field(description="sources that timed out or raised; the others answered")
    selection: SelectionRecord | None = None
    routing: RoutingRecord | None = Field(None, description="which sources were asked at all (more sources than "
                                                            "[routing] above)")
    rerank: RerankRecord | None = None
    timings: dict[str, float] = Field(description="seconds: routing, retrieval, selection, prior, target, lm_pass, "
                                                  "generation, ranking, source:<name>")


class CitationRecord(BaseModel):
    number: int
    source: str
    doc_id: str
    title: str
    location: LocationRecord | None = Field(None, description="the cited passage's place in its file (files)")


class EvidenceRecord(BaseModel):
    passage: int = Field(description="the passage's number, as the answer cites it [n]")
    source: str
    doc_id: str
    span: tuple[int, int] = Field(description="characters of the passage's text")
    parent_span: tuple[int, int] | None = Field(None, description="characters of the parent document (chunks)")
    text: str
    score: float = Field(description="the evidence scorer's value; comparable within one answer only")
    location: LocationRecord | None = Field(None, description="its passage's place in its file (files); a "
                                            "table row's own row")
    columns: list[str] = Field(default_factory=list, description="a table row's column names")


class StatementRecord(BaseModel):
    text: str = Field(description="a sentence of the written answer, with the markers it cites by")
    cited: list[int] = Field(description="the passages its markers name")
    supported: bool = Field(description="a sentence of the passages (or two in a row) holds what it says")
    support: list[EvidenceRecord] = Field(default_factory=list, description="those sentences")


class AnswerRecord(BaseModel):
    question: str
    answer: str
    citations: list[CitationRecord]
    invalid_citations: list[int] = Field(description="numbers the model cited that match no passage")
    passages: list[CandidateRecord] = Field(description="the passages the answer read (quoted or given to the generator), numbered from 1")
    dropped: list[CandidateRecord] = Field(default_factory=list, description="the lowest-ranked passages, left "
                                           "out because they did not fit the generator's context window")
    failures: list[FailureRecord]
    generator: str
    generator_note: str = Field(description="who wrote the answer, in words a reader can weigh it by")
    method: str
    selection: SelectionRecord | None = None
    routing: RoutingRecord | None = None
    rerank: RerankRecord | None = None
    timings: dict[str, float]
    evidence: list[EvidenceRecord] = Field(default_factory=list, description="the passages' sentences the answer "
                                           "quotes, best first ([evidence] scorer)")
    support: float | None = Field(None, description="the chance that the passages hold the answer (0-1)")
    support_at_least: bool = Field(False, description="support is a lower bound: the best sentences cleared the "
                                   "threshold of \"not found\" alone, and the rest were not read for it")
    abstained: bool = Field(False, description="the evidence was too weak ([evidence] abstain_below): the answer "
                                               "says it was not found, and quotes what came closest")
    unsupported: bool = Field(False, description="a written answer none of whose sentences the passages support")
    written: str | None = Field(None, description="a generator's own text (what a stream sent), before its "
                                "citations were corrected")
    statements: list[StatementRecord] = Field(default_factory=list, description="a written answer's sentences, "
                                              "each with the passages' sentences that support it")


class SourceRecord(BaseModel):
    name: str
    status: str = Field(description="ok | error")
    error: str | None = None
    kind: str | None = None
    documents: int | None = None
    index_bytes: int | None = None
    encoder: str | None = None
    retrieval: str | None = None
    built_at: str | None = None
    input: str | None = None


def candidate_record(candidate: Candidate) -> CandidateRecord:
    return CandidateRecord(
        key=candidate.key, source=candidate.source, doc_id=candidate.doc_id, title=candidate.title,
        text=candidate.text, native_score=candidate.native_score, native_rank=candidate.native_rank,
        parent_id=candidate.parent_id, span=candidate.span, cut_from=candidate.cut_from,
        location=location_record(candidate.location),
        score_kind=candidate.score_kind, metadata=candidate.metadata,
        scores={name: _finite(value) for name, value in candidate.scores.items()},
        merged=[CopyRecord(source=m.source, doc_id=m.doc_id, native_rank=m.native_rank, native_score=m.native_score)
                for m in candidate.merged],
    )


def failure_record(failure: SourceFailure) -> FailureRecord:
    return FailureRecord(source=failure.source, reason=failure.reason, detail=failure.detail)


def _selection(result: SearchResult) -> SelectionRecord | None:
    decision = result.selection
    if decision is None:
        return None
    return SelectionRecord(
        chosen=[SourceStepRecord(source=s.source, gain=s.gain, relevance=s.relevance, penalty=s.penalty)
                for s in decision.chosen],
        dropped=decision.dropped,
        relevance={name: _finite(value) for name, value in decision.relevance.items()},
    )


def _routing(result: SearchResult) -> RoutingRecord | None:
    decision = result.routing
    if decision is None:
        return None
    return RoutingRecord(router=decision.router, budget=decision.budget, widened=decision.widened,
                         asked=decision.asked, unscored=decision.unscored, skipped=decision.skipped)


def _rerank(result: SearchResult) -> RerankRecord | None:
    outcome = result.rerank
    if outcome is None:
        return None
    return RerankRecord(scorer=outcome.scorer, score_key=outcome.score_key, target=outcome.target, loss=outcome.loss,
                        seconds=outcome.seconds, target_seconds=outcome.target_seconds)


def search_record(result: SearchResult) -> SearchRecord:
    return SearchRecord(
        query=result.query, method=result.method, candidates=[candidate_record(c) for c in result.candidates],
        failures=[failure_record(f) for f in result.failures], selection=_selection(result),
        routing=_routing(result), rerank=_rerank(result), timings=result.timings,
    )


def answer_record(answer: Answer) -> AnswerRecord:
    return AnswerRecord(
        question=answer.question, answer=answer.text,
        citations=[CitationRecord(number=c.number, source=c.source, doc_id=c.doc_id, title=c.title,
                                  location=location_record(c.location)) for c in answer.citations],
        invalid_citations=answer.invalid_citations, passages=[candidate_record(c) for c in answer.passages],
        dropped=[candidate_record(c) for c in answer.dropped],
        failures=[failure_record(f) for f in answer.failures], generator=answer.generator,
        generator_note=describe_generator(answer.generator),
        method=answer.search.method, selection=_selection(answer.search), routing=_routing(answer.search),
        rerank=_rerank(answer.search),
        timings=answer.timings, evidence=[evidence_record(e) for e in answer.evidence], support=answer.support,
        support_at_least=answer.support_at_least,
        abstained=answer.abstained, unsupported=answer.unsupported, written=answer.written,
        statements=[StatementRecord(text=s.text, cited=list(s.cited), supported=s.supported,
                                    support=[evidence_record(e) for e in s.support]) for s in answer.statements],
    )


def citations_and_evidence(record: AnswerRecord) -> dict:
    """An answer's citations, each with the sentences quoted from it, and all its evidence, as plain data (the
    OpenAI-compatible message's and the MCP tool's extension)."""
    evidence = [e.model_dump(mode="json") for e in record.evidence]
    citations = [{**c.model_dump(mode="json"), "quotes": [e for e in evidence if e["passage"] == c.number]}
                 for c in record.citations]
    return {"citations": citations, "evidence": evidence}


def served_source_record(name: str, stats: SourceStats | None, error: str | None = None) -> SourceRecord:
    """A source's record as a server shows it: a file's name, not where it lies on the server."""
    record = source_record(name, stats, error)
    if record.input and record.kind != "postgres":
        record.input = Path(record.input).name
    return record


def answer_outcome(record: AnswerRecord) -> dict:
    """What an answer came to besides its text, citations and evidence (the OpenAI-compatible response's and the MCP
    tool's): the question asked, the method, whether it abstained, whether a written answer found no support, the
    answer as corrected (a stream sent it as written), its sentences' support, its support, who wrote it, numbers
    cited that match no passage, and the sources that failed."""
    return {"question": record.question, "method": record.method, "abstained": record.abstained,
            "unsupported": record.unsupported, "answer": record.answer,
            "statements": [s.model_dump(mode="json") for s in record.statements], "support": record.support,
            "support_at_least": record.support_at_least, "generator_note": record.generator_note,
            "invalid_citations": record.invalid_citations,
            "failures": [f.model_dump(mode="json") for f in record.failures]}


def source_record(name: str, stats: SourceStats | None, error: str | None = None) -> SourceRecord:
    if stats is None:
        return SourceRecord(name=name, status="error", error=redact(error or ""))
    return SourceRecord(name=name, status="ok", kind=stats.kind, documents=stats.documents,
                        index_bytes=stats.index_bytes, encoder=stats.encoder, retrieval=stats.retrieval,
                        built_at=stats.built_at, input=stats.input)
