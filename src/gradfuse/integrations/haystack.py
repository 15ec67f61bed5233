"""Haystack 2 components (haystack-ai 3.4): `GradfuseRetriever` over a workspace and `GradfuseRanker`, which
re-ranks any Haystack documents with stage 2.

    pipeline.add_component("retriever", GradfuseRetriever(Workspace.open(), method="gro"))
    pipeline.add_component("ranker", GradfuseRanker(Workspace.open(), top_k=5))

Importing this module first turns Haystack's telemetry off (it would try to reach the network), unless
HAYSTACK_TELEMETRY_ENABLED is set.
"""

from __future__ import annotations

import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document, component  # noqa: E402  (after the telemetry setting)

from gradfuse.integrations import RERANK_METHOD, ranked_documents, rerank_passages  # noqa: E402


@component
class GradfuseRetriever:
    """Every source of a workspace with any gradfuse method; provenance, scores and failures in `meta`."""

    def __init__(self, workspace, **search_options):
        self.workspace, self.search_options = workspace, search_options

    @component.output_types(documents=list[Document])
    def run(self, query: str) -> dict:
        return {"documents": [Document(content=d.text, meta=d.metadata, score=d.score)
                              for d in ranked_documents(self.workspace, query, **self.search_options)]}


@component
class GradfuseRanker:
    """Stage 2 over documents from any retriever: their order is the prior, the scoring LM reorders them."""

    def __init__(self, workspace, *, method: str = RERANK_METHOD, top_k: int | None = None, **rerank_options):
        self.workspace, self.method, self.top_k, self.rerank_options = workspace, method, top_k, rerank_options

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict:
        passages = [(d.content or "", str(d.meta.get("title", ""))) for d in documents]
        ranked = rerank_passages(self.workspace, query, passages, method=self.method, top_n=top_k or self.top_k,
                                 **self.rerank_options)
        return {"documents": [Document(id=documents[i].id, content=documents[i].content,
                                       meta={**documents[i].meta, "gradfuse": meta}, score=score)
                              for i, score, meta in ranked]}
