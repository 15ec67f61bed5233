"""LangChain components (langchain-core 1.8): `GradfuseRetriever`, a retriever over a workspace, and
`GradfuseReranker`, a document compressor that re-ranks any LangChain documents with stage 2.

    retriever = GradfuseRetriever(workspace=Workspace.open(), search_options={"method": "gro"})
    reranker = GradfuseReranker(workspace=Workspace.open(), top_n=5)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun, Callbacks
from langchain_core.documents import Document
from langchain_core.documents.compressor import BaseDocumentCompressor
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from gradfuse.integrations import RERANK_METHOD, ranked_documents, rerank_passages


class GradfuseRetriever(BaseRetriever):
    """Every source of a workspace with any gradfuse method; provenance, scores and failures in the metadata."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    workspace: Any = Field(description="a gradfuse Workspace")
    search_options: dict = Field(default_factory=dict, description="Workspace.search options: method, k, ...")

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=d.text, metadata=d.metadata)
                for d in ranked_documents(self.workspace, query, **self.search_options)]


class GradfuseReranker(BaseDocumentCompressor):
    """Stage 2 over LangChain documents from any retriever: their order is the prior, the scoring LM reorders."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    workspace: Any = Field(description="a gradfuse Workspace (its [rerank] settings and scoring LM)")
    method: str = RERANK_METHOD
    top_n: int | None = None
    rerank_options: dict = Field(default_factory=dict, description="RerankSettings fields: target, estimator, ...")

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        passages = [(d.page_content, str(d.metadata.get("title", ""))) for d in documents]
        ranked = rerank_passages(self.workspace, query, passages, method=self.method, top_n=self.top_n,
                                 **self.rerank_options)
        return [Document(page_content=documents[i].page_content,
                         metadata={**documents[i].metadata, "relevance_score": score, "gradfuse": meta})
                for i, score, meta in ranked]
