"""Thin components for the frameworks people already build RAG in (one file each: langchain.py, llamaindex.py,
haystack.py). What they share is here:

- a retriever over a workspace returns `ranked_documents`: every candidate's text with gradfuse's provenance,
  scores and the query's source failures in its metadata (no framework has a place for "these sources failed"
  on a retrieval result, so each document carries them);
- a reranker over the framework's own documents runs stage 2 through `rerank_passages`: the documents become
  one source whose incoming order is the pool and the prior (they have no encoder prior of their own), and the
  configured scoring LM reorders them;
- both put each of the first `evidence_k` documents' evidence in its metadata (`evidence`: the sentences among
  the `[evidence] top` best of those documents, scored together as an answer's are, with their character spans
  into the document's text), so a framework's prompt can quote or keep only them, and whether those documents
  hold an answer at all as an answer would say it (`support`, the chance; `abstained`: below
  `[evidence] abstain_below`, where an answer says "not found in these sources"). `evidence_k` defaults to
  `[generator] context_k`, the passages an answer reads; 0 scores none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gradfuse.candidate import Candidate
from gradfuse.reading.support import declines
from gradfuse.schemas import failure_record, location_record
from gradfuse.federation.federated import FederatedResult
from gradfuse.workspace import SearchResult, Workspace

FOREIGN_SOURCE = "input"  # the one source a reranker's incoming documents form
# A reranker's method: stage 2 by the workspace's signal (`[rerank] scorer`, UPR by default); stage 1 keeps the one
# source its incoming documents form. A retriever's method is the workspace's default (`[defaults] method`).
RERANK_METHOD = "gro"


@dataclass(frozen=True)
class RankedDocument:
    text: str
    metadata: dict
    score: float


def document_metadata(candidate: Candidate, result: SearchResult, rank: int) -> dict:
    """gradfuse's view of one ranked candidate, in plain JSON types (frameworks copy and serialise metadata)."""
    return {
        "source": candidate.source,
        "doc_id": candidate.doc_id,
        "title": candidate.title,
        "rank": rank,
        "native_rank": candidate.native_rank,
        "native_score": candidate.native_score,
        "scores": dict(candidate.scores),
        "provenance": [{"source": s, "doc_id": d, "native_rank": r} for s, d, r in candidate.provenance],
        "method": result.method,
        "location": record.model_dump() if (record := location_record(candidate.location)) else None,
        "failures": [failure_record(f).model_dump() for f in result.failures],  # as the JSON API shows them
    }


def main_score(candidate: Candidate) -> float:
    """The score the method ranked by: stage 2's final score, else the fusion's, else the source's own."""
    for name in ("rerank:final", *sorted(k for k in candidate.scores if k.startswith("fusion:"))):
        if name in candidate.scores:
            return float(candidate.scores[name])
    return float(candidate.native_score)


def evidence_by_document(workspace: Workspace, query: str, candidates: list[Candidate],
                         evidence_k: int | None) -> list[dict]:
    """For each candidate, metadata of its evidence: `evidence`, its sentences among the best `[evidence] top` of
    the first `evidence_k` candidates, best first (passage: its rank, span, parent_span, text, score, comparable
    within one query only); `support` and `abstained`, the same for every document (see the module's text)."""
    count = workspace.config.context_k if evidence_k is None else evidence_k
    evidence = workspace.evidence(query, candidates[:count])
    threshold = workspace.config.evidence.abstain_below
    chance = workspace.support(query, evidence)  # exact, not a lower bound: the metadata has no field to say so
    abstained = declines(query, evidence, chance, threshold)
    verdict = {"support": chance, "abstained": abstained}
    by_document: list[dict] = [{"evidence": [], **verdict} for _ in candidates]
    for sentence in evidence[: workspace.config.evidence.top]:
        record = asdict(sentence)
        del record["source"], record["doc_id"], record["location"]  # the document's own metadata says them
        by_document[sentence.passage - 1]["evidence"].append(record)
    return by_document


def ranked_documents(workspace: Workspace, query: str, *, evidence_k: int | None = None,
                     **search_options) -> list[RankedDocument]:
    """`Workspace.search`, as framework-neutral documents best first, with their evidence."""
    result = workspace.search(query, **search_options)
    evidence = evidence_by_document(workspace, query, result.candidates, evidence_k)
    return [RankedDocument(c.text, {**document_metadata(c, result, rank), **found}, main_score(c))
            for rank, (c, found) in enumerate(zip(result.candidates, evidence), start=1)]


def rerank_passages(workspace: Workspace, query: str, passages: list[tuple[str, str]], *, method: str = RERANK_METHOD,
                    top_n: int | None = None, evidence_k: int | None = None,
                    **rerank_options) -> list[tuple[int, float, dict]]:
    """Stage 2 over foreign passages ((text, title) in their incoming order): (index into `passages`, score,
    metadata with evidence) best first, at most `top_n`. The incoming order is the pool and the prior
    (`pool="rrf"` over one source), and every passage enters the pass unless `n` says otherwise."""
    if not passages:
        return []
    candidates = [Candidate(FOREIGN_SOURCE, str(index), text, float(len(passages) - index), index + 1, title)
                  for index, (text, title) in enumerate(passages)]
    options = {"pool": "rrf", "n": len(passages), **rerank_options}
    result = workspace.rank(query, FederatedResult({FOREIGN_SOURCE: candidates}), method=method,
                            k=top_n or len(passages), **options)
    evidence = evidence_by_document(workspace, query, result.candidates, evidence_k)
    return [(int(c.doc_id), main_score(c), {**document_metadata(c, result, rank), **found})
            for rank, (c, found) in enumerate(zip(result.candidates, evidence), start=1)]
