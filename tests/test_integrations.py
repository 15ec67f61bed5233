"""The LangChain, LlamaIndex and Haystack components in small pipelines of the real frameworks (no mocks of them),
with the real encoder, the real scoring LM and the bundled generator. Each workspace also holds a PostgreSQL source
whose server refuses connections: its failure must reach the framework's documents."""

from __future__ import annotations

import pytest
from conftest import ASTRONOMY, COOKING, write_jsonl

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config, SourceSettings
from gradfuse.generate import make_generator
from gradfuse.embedding.encoder import load_encoder
from gradfuse.sources.postgres import PostgresSettings

QUESTION = "Which planet has the moons Phobos and Deimos?"
FOREIGN = [  # documents a framework's own store holds, never indexed by gradfuse
    {"title": "Bread", "text": "Bread dough rises because yeast ferments sugar."},
    {"title": "Venus", "text": "Venus has a thick carbon dioxide atmosphere."},
    {"title": "Mars", "text": "Mars has two small moons, Phobos and Deimos, named after the sons of Ares."},
    {"title": "Risotto", "text": "Risotto is cooked by adding hot stock to arborio rice."},
]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    root = tmp_path_factory.mktemp("integrations")
    refused = PostgresSettings(table="kb", url="postgresql://postgres@127.0.0.1:9/kb")  # nothing listens on 9
    workspace = Workspace(Config(workspace=root / "ws", sources={"db": SourceSettings(postgres=refused)}))
    workspace.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(root / "a.jsonl", ASTRONOMY))))
    workspace.index(SourceSpec("cooking", "jsonl", str(write_jsonl(root / "c.jsonl", COOKING))))
    return workspace


def _check_retrieved(metadata: list[dict], method: str = "rrf") -> None:
    top = metadata[0]
    assert top["method"] == method and top["abstained"] is False and top["support"] > 0.5
    assert (top["source"], top["doc_id"]) in {("astronomy", "mars"), ("cooking", "mars-copy")}
    assert {"source", "doc_id", "rank", "native_rank", "scores", "provenance", "method"} <= set(top)
    assert all(m["failures"] and m["failures"][0]["source"] == "db" for m in metadata)  # visible, not vanished
    _check_evidence(ASTRONOMY[0]["text"], metadata)


def _check_evidence(first_text: str, metadata: list[dict]) -> None:
    """The best sentence of the documents' evidence (scored together, by the workspace's evidence scorer) is the first
    document's moons sentence, and its span points at it in that document's text."""
    best = max((e for m in metadata for e in m["evidence"]), key=lambda e: e["score"])
    start, end = best["span"]
    assert best in metadata[0]["evidence"] and best["passage"] == 1
    assert first_text[start:end] == best["text"] and "Phobos" in best["text"]


# The scoring LM alone (no prior from the incoming order), with the question as its target: the incoming documents
# are handed over with Mars last, and must come back with Mars first.
LM_ALONE = {"target": "query", "prior_weight": 0.0}


def _check_reranked(titles: list[str], metadata: list[dict]) -> None:
    assert titles[0] == "Mars" and sorted(titles) == sorted(d["title"] for d in FOREIGN)
    assert metadata[0]["method"] == "gro" and "rerank:upr" in metadata[0]["scores"]  # the default signal
    assert all("rerank:final" in m["scores"] for m in metadata)
    _check_evidence(next(d["text"] for d in FOREIGN if d["title"] == "Mars"), metadata)


@pytest.mark.slow
def test_langchain_retriever_feeds_a_prompt_and_the_reranker_reorders_langchains_own_retrieval(ws):
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda
    from langchain_core.vectorstores import InMemoryVectorStore

    from gradfuse.integrations.langchain import GradfuseReranker, GradfuseRetriever

    retriever = GradfuseRetriever(workspace=ws, search_options={"method": "rrf", "k": 3, "retrieval": "bm25"})
    generator = make_generator("smollm2")
    prompt = ChatPromptTemplate.from_messages([("user", "Passages:\n{context}\n\nQuestion: {question}")])

    def answer(value) -> str:
        messages = [{"role": "user" if m.type == "human" else m.type, "content": m.content}
                    for m in value.to_messages()]
        return generator.generate(messages, max_new_tokens=12)

    chain = ({"context": retriever | (lambda docs: "\n".join(d.page_content for d in docs)),
              "question": lambda q: q} | prompt | RunnableLambda(answer))
    assert chain.invoke(QUESTION).strip()
    documents = retriever.invoke(QUESTION)
    _check_retrieved([d.metadata for d in documents])

    class MiniLM(Embeddings):  # gradfuse's encoder behind LangChain's own interface
        def embed_documents(self, texts):
            return load_encoder().encode(texts).tolist()

        def embed_query(self, text):
            return load_encoder().encode([text])[0].tolist()

    store = InMemoryVectorStore(MiniLM())
    store.add_documents([Document(page_content=d["text"], metadata={"title": d["title"]}) for d in FOREIGN])
    found = store.as_retriever(search_kwargs={"k": 4}).invoke("moons of the red planet, Phobos")
    found = sorted(found, key=lambda d: d.metadata["title"] == "Mars")  # Mars last
    reranked = GradfuseReranker(workspace=ws, rerank_options=LM_ALONE).compress_documents(found, QUESTION)
    _check_reranked([d.metadata["title"] for d in reranked], [d.metadata["gradfuse"] for d in reranked])


@pytest.mark.slow
def test_llamaindex_query_engine_over_the_retriever_and_the_reranker_after_its_own_index(ws):
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.core.embeddings import BaseEmbedding
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
    from llama_index.core.llms.callbacks import llm_completion_callback
    from llama_index.core.query_engine import RetrieverQueryEngine

    from gradfuse.lm.models import load_tokenizer
    from gradfuse.integrations.llamaindex import GradfuseReranker, GradfuseRetriever

    generator = make_generator("smollm2")

    class SmolLM2(CustomLLM):  # the bundled generator as LlamaIndex's LLM
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(context_window=8192, num_output=16, model_name="smollm2")

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kwargs) -> CompletionResponse:
            return CompletionResponse(text=generator.generate([{"role": "user", "content": prompt}],
                                                              max_new_tokens=16))

        @llm_completion_callback()
        def stream_complete(self, prompt: str, formatted: bool = False, **kwargs):
            yield self.complete(prompt)

    class MiniLM(BaseEmbedding):
        def _get_query_embedding(self, query):
            return load_encoder().encode([query])[0].tolist()

        def _get_text_embedding(self, text):
            return load_encoder().encode([text])[0].tolist()

        async def _aget_query_embedding(self, query):
            return self._get_query_embedding(query)

    tokenizer = load_tokenizer("smollm2")
    Settings.tokenizer = lambda text: tokenizer.encode(text)  # offline: tiktoken would download its vocabulary
    retriever = GradfuseRetriever(ws, method="rrf", k=3, retrieval="bm25")
    engine = RetrieverQueryEngine.from_args(retriever, llm=SmolLM2())
    response = engine.query(QUESTION)
    assert str(response).strip()
    _check_retrieved([n.node.metadata for n in response.source_nodes])
    assert "failures" not in response.source_nodes[0].node.get_content(metadata_mode="llm")  # kept from the LLM

    index = VectorStoreIndex.from_documents([Document(text=d["text"], metadata={"title": d["title"]})
                                             for d in FOREIGN], embed_model=MiniLM())
    found = index.as_retriever(similarity_top_k=4).retrieve("moons of the red planet, Phobos")
    found = sorted(found, key=lambda n: n.node.metadata["title"] == "Mars")  # Mars last
    reranked = GradfuseReranker(workspace=ws, rerank_options=LM_ALONE).postprocess_nodes(found, query_str=QUESTION)
    _check_reranked([n.node.metadata["title"] for n in reranked], [n.node.metadata["gradfuse"] for n in reranked])


@pytest.mark.slow
def test_haystack_retriever_feeds_its_prompt_builder_and_the_ranker_follows_its_bm25_retriever(ws):
    from gradfuse.integrations.haystack import GradfuseRanker, GradfuseRetriever  # first: telemetry off

    from haystack import Document, Pipeline
    from haystack.components.builders import PromptBuilder
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    answer_pipeline = Pipeline()
    answer_pipeline.add_component("retriever", GradfuseRetriever(ws, method="rrf", k=3, retrieval="bm25"))
    answer_pipeline.add_component("prompt", PromptBuilder(
        template="{% for d in documents %}{{ d.content }}\n{% endfor %}Question: {{ question }}",
        required_variables=["documents", "question"]))
    answer_pipeline.connect("retriever.documents", "prompt.documents")
    built = answer_pipeline.run({"retriever": {"query": QUESTION}, "prompt": {"question": QUESTION}},
                                include_outputs_from={"retriever"})
    assert "Phobos" in built["prompt"]["prompt"] and built["prompt"]["prompt"].endswith(QUESTION)
    _check_retrieved([d.meta for d in built["retriever"]["documents"]])

    store = InMemoryDocumentStore()
    store.write_documents([Document(content=d["text"], meta={"title": d["title"]}) for d in FOREIGN])
    rank_pipeline = Pipeline()
    rank_pipeline.add_component("bm25", InMemoryBM25Retriever(store, top_k=4))
    rank_pipeline.add_component("ranker", GradfuseRanker(ws, **LM_ALONE))
    rank_pipeline.connect("bm25.documents", "ranker.documents")
    ranked = rank_pipeline.run({"bm25": {"query": "bread rice atmosphere planet moons"},
                                "ranker": {"query": QUESTION}}, include_outputs_from={"bm25"})
    assert ranked["bm25"]["documents"][0].meta["title"] != "Mars"  # BM25's own order puts another first
    ranked = ranked["ranker"]["documents"]
    _check_reranked([d.meta["title"] for d in ranked], [d.meta["gradfuse"] for d in ranked])


def test_stage_2_over_foreign_passages_keeps_every_passage_and_its_incoming_index(ws):
    from gradfuse.integrations import rerank_passages

    passages = [(d["text"], d["title"]) for d in FOREIGN]
    ranked = rerank_passages(ws, QUESTION, passages[::-1], method="upr", top_n=3, prior_weight=0.0)
    assert len(ranked) == 3 and passages[::-1][ranked[0][0]][1] == "Mars"
    assert [m["rank"] for _, _, m in ranked] == [1, 2, 3] and all(m["source"] == "input" for _, _, m in ranked)
    assert rerank_passages(ws, QUESTION, []) == []


def test_every_frameworks_retriever_defaults_to_the_workspace_method_and_says_when_nothing_answers(ws):
    from gradfuse.integrations.haystack import GradfuseRetriever as HaystackRetriever
    from gradfuse.integrations.langchain import GradfuseRetriever as LangChainRetriever
    from gradfuse.integrations.llamaindex import GradfuseRetriever as LlamaIndexRetriever

    for question, abstained in ((QUESTION, False), ("What is the default TCP port of a PostgreSQL server?", True)):
        metadata = {
            "langchain": [d.metadata for d in LangChainRetriever(workspace=ws).invoke(question)],
            "llamaindex": [n.node.metadata for n in LlamaIndexRetriever(ws).retrieve(question)],
            "haystack": [d.meta for d in HaystackRetriever(ws).run(query=question)["documents"]],
        }
        for framework, documents in metadata.items():
            assert documents and all(m["method"] == ws.config.method == "select" for m in documents), framework
            assert all(m["abstained"] is abstained for m in documents), framework
