"""A framework's retriever as a source (`Workspace.add_source(name, retriever)`): any LangChain `BaseRetriever`
(`invoke(query)` gives Documents) or LlamaIndex `BaseRetriever` (`retrieve(query)` gives scored nodes), which
opens every store those frameworks integrate, each with its own embeddings.

A passage's doc id is the document's own id (LangChain's `Document.id`, else `metadata["id"]`, else the rank it
came back at), or a LlamaIndex node's id with its document's as the parent; its title is `metadata["title"]`
where there is one. Its score here is the reciprocal
of its rank (higher is better, whatever the store's own score means, a distance or a similarity). A retriever that
raises is this source's failure; the other sources answer.
"""

from __future__ import annotations

from gradfuse.access import Readers
from gradfuse.candidate import Candidate
from gradfuse.sources.base import SourceError, SourceStats


class RetrieverSource:
    kind = "retriever"

    def __init__(self, name: str, retriever):
        self.name, self._retriever = name, retriever
        self._framework = _framework(retriever)

    def warm(self) -> None:
        """Nothing to load here: the retriever embeds its own queries."""

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        # A retriever object filters its own documents: only who may read the source is decided here.
        if self._framework == "langchain":
            found = [(d.id or d.metadata.get("id"), None, d.page_content, d.metadata)
                     for d in self._retriever.invoke(query)]
        else:  # a node is a chunk of a document: its own id, and its document's as the parent
            found = [(n.node.node_id, n.node.ref_doc_id, n.node.get_content(), n.node.metadata)
                     for n in self._retriever.retrieve(query)]
        candidates = []
        for rank, (doc_id, parent_id, text, metadata) in enumerate(found[:k], start=1):
            if not isinstance(text, str):
                raise SourceError(f"the {self._framework} retriever gave a document whose text is "
                                  f"{type(text).__name__}, not a string")
            candidates.append(Candidate(source=self.name, doc_id=str(doc_id if doc_id is not None else rank),
                                        text=text, native_score=1.0 / rank, native_rank=rank,
                                        title=str((metadata or {}).get("title") or ""), score_kind="1/rank",
                                        parent_id=str(parent_id) if parent_id is not None else None))
        return candidates

    def stats(self) -> SourceStats:
        return SourceStats(name=self.name, kind=f"{self._framework} retriever", documents=0, index_bytes=None,
                           encoder=None, built_at="-", input=type(self._retriever).__name__, retrieval="its own")


def _framework(retriever) -> str:
    """"langchain" or "llamaindex", by the retriever's base class (each framework imported only if installed)."""
    try:
        from langchain_core.retrievers import BaseRetriever as LangChainRetriever

        if isinstance(retriever, LangChainRetriever):
            return "langchain"
    except ImportError:
        pass
    try:
        from llama_index.core.base.base_retriever import BaseRetriever as LlamaIndexRetriever

        if isinstance(retriever, LlamaIndexRetriever):
            return "llamaindex"
    except ImportError:
        pass
    raise TypeError(f"a {type(retriever).__name__} is not a LangChain or LlamaIndex BaseRetriever")
