"""LlamaIndex components (llama-index-core 0.14): `GradfuseRetriever`, a retriever over a workspace, and
`GradfuseReranker`, a node postprocessor that re-ranks any nodes with stage 2.

    retriever = GradfuseRetriever(Workspace.open(), method="gro")
    engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[GradfuseReranker(workspace=ws)])

gradfuse's metadata is kept out of what the LLM and the embedder see.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from pydantic import Field

from gradfuse.integrations import RERANK_METHOD, ranked_documents, rerank_passages


def _node(text: str, metadata: dict, node_id: str) -> TextNode:
    keys = list(metadata)
    return TextNode(text=text, id_=node_id, metadata=metadata, excluded_llm_metadata_keys=keys,
                    excluded_embed_metadata_keys=keys)


class GradfuseRetriever(BaseRetriever):
    """Every source of a workspace with any gradfuse method; provenance, scores and failures in the metadata."""

    def __init__(self, workspace, **search_options):
        self.workspace, self.search_options = workspace, search_options
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=_node(d.text, d.metadata, f"{d.metadata['source']}/{d.metadata['doc_id']}"),
                              score=d.score)
                for d in ranked_documents(self.workspace, query_bundle.query_str, **self.search_options)]


class GradfuseReranker(BaseNodePostprocessor):
    """Stage 2 over nodes from any retriever: their order is the prior, the scoring LM reorders them."""

    workspace: Any = Field(exclude=True, description="a gradfuse Workspace (its [rerank] settings and scoring LM)")
    method: str = RERANK_METHOD
    top_n: int | None = None
    rerank_options: dict = Field(default_factory=dict)

    @classmethod
    def class_name(cls) -> str:
        return "GradfuseReranker"

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None,
                           ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("GradfuseReranker needs the query (a query bundle)")
        passages = [(n.node.get_content(), str(n.node.metadata.get("title", ""))) for n in nodes]
        ranked = rerank_passages(self.workspace, query_bundle.query_str, passages, method=self.method,
                                 top_n=self.top_n, **self.rerank_options)
        out = []
        for index, score, meta in ranked:
            node = nodes[index].node
            node.metadata["gradfuse"] = meta
            node.excluded_llm_metadata_keys = [*node.excluded_llm_metadata_keys, "gradfuse"]
            node.excluded_embed_metadata_keys = [*node.excluded_embed_metadata_keys, "gradfuse"]
            out.append(NodeWithScore(node=node, score=score))
        return out
