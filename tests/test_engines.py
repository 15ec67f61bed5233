"""Sources that an engine serves in place, against the real engine: here another `gradfuse serve` (its own
process, its own workspace and key) declared as `kind = "gradfuse"` beside a local source. Search by text with
provenance kept, the remote's failure as this source's failure while the rest answers, a refused or missing key,
and settings that would put a secret in the file."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from conftest import ASTRONOMY, COOKING, with_remote, write_jsonl
from live_server import gradfuse_serve

from gradfuse import SourceSpec, Workspace
from gradfuse.config import ConfigError, load_config

KEY = "remote-key-for-tests"


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A second gradfuse server holding one source (astronomy), keyed."""
    root = tmp_path_factory.mktemp("remote")
    ws = Workspace(load_config(workspace=root / "ws"))
    ws.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(root / "a.jsonl", ASTRONOMY))))
    with gradfuse_serve(root / "ws", env={"GRADFUSE_API_KEY": KEY}) as url:
        yield url


def test_another_gradfuse_server_is_a_source_with_provenance_kept(remote, tmp_path, monkeypatch):
    monkeypatch.setenv("TEAM_KEY", KEY)
    ws = with_remote(tmp_path, remote, key_env='"TEAM_KEY"')
    assert ws.source_names() == ["cooking", "team"]
    result = ws.search("Which planet has the moons Phobos and Deimos?", method="rrf", k=5)
    assert not result.failures
    # the local cooking source holds a copy of the Mars passage: one passage, both provenances
    top = result.candidates[0]
    assert ("team", "astronomy/mars", 1) in top.provenance
    remote_copy = next(c for c in (top, *top.merged) if c.source == "team")
    assert "Phobos" in remote_copy.text and remote_copy.title == "Mars"
    assert remote_copy.native_score == 1.0  # the remote's first, scored by its rank
    assert any(c.key == "team/astronomy/jupiter" for c in result.candidates)
    selected = ws.search("Which planet has the moons Phobos and Deimos?", method="select", k=3)
    assert ("team", "astronomy/mars", 1) in selected.candidates[0].provenance  # stage 1 embeds what came back
    stats = dict((name, stats) for name, stats, _ in ws.source_health())["team"]
    assert stats.kind == "gradfuse" and stats.documents == len(ASTRONOMY)


def test_a_refused_missing_or_unreachable_remote_fails_alone(remote, tmp_path, monkeypatch):
    monkeypatch.setenv("TEAM_KEY", "not-the-key")
    refused = with_remote(tmp_path / "refused", remote, key_env='"TEAM_KEY"')
    result = refused.search("pasta", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["team"] and "refused the key in TEAM_KEY" in result.failures[0].detail
    assert result.candidates and all(c.source == "cooking" for c in result.candidates)
    assert "not-the-key" not in result.failures[0].detail

    monkeypatch.delenv("TEAM_KEY")
    unset = refused.search("pasta", method="rrf", k=3)
    assert "TEAM_KEY" in unset.failures[0].detail and "not set" in unset.failures[0].detail

    down = with_remote(tmp_path / "down", "http://127.0.0.1:9", timeout_s=2)  # nothing listens on the discard port
    result = down.search("pasta", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["team"] and "cannot be reached" in result.failures[0].detail
    assert result.candidates


def test_what_one_caller_asks_of_a_remote_never_opens_its_breaker_for_the_others(remote, tmp_path, monkeypatch):
    """Issue 58 H1: a depth beyond the remote's max_k (100) and a question beyond its max_query_chars (8000) were
    answered 422, counted as the source's failures, and opened its breaker for every caller."""
    monkeypatch.setenv("TEAM_KEY", KEY)
    ws = with_remote(tmp_path, remote, guard="breaker_failures = 2", key_env='"TEAM_KEY"')
    for _ in range(3):
        deep = ws.search("Which planet has the moons Phobos and Deimos?", method="rrf", k=3, depth=150)
        assert not deep.failures  # asked at the remote's own max_k
        long = ws.search("planet " * 2000, method="rrf", k=3)  # 14,000 characters: refused before it is sent
        assert [f.source for f in long.failures] == ["team"] and "at most 8000 characters" in long.failures[0].detail
    assert ws.guards.state("team") == "closed" and ws.guards["team"].breaker.failures == 0
    ws.guards["team"].breaker.failed("timeout")  # nor does a refused question reset what the source did before
    assert ws.search("planet " * 2000, method="rrf", k=3).failures and ws.guards["team"].breaker.failures == 1
    result = ws.search("Which planet has the moons Phobos and Deimos?", method="rrf", k=3)
    assert not result.failures and any(c.source == "team" for c in result.candidates)


def test_a_remote_source_takes_no_secret_in_the_file(tmp_path):
    config = tmp_path / "gradfuse.toml"
    config.write_text('[sources.team]\nkind = "gradfuse"\nurl = "http://user:secret@127.0.0.1:8321"\n')
    with pytest.raises(ConfigError, match="must not carry credentials") as raised:
        load_config(config)
    assert "secret" not in str(raised.value).replace("must not carry credentials", "")
    config.write_text('[sources.team]\nkind = "gradfuse"\nurl = "http://127.0.0.1:8321"\nkey = "abc"\n')
    with pytest.raises(ConfigError, match="key"):
        load_config(config)
    config.write_text('[sources.team]\nkind = "gradfuse"\nurl = "ftp://127.0.0.1"\n')
    with pytest.raises(ConfigError, match="http"):
        load_config(config)
    assert os.environ.get("GRADFUSE_API_KEY") != KEY  # the remote's key stayed in its own process


# --- a framework's retriever as a source -------------------------------------------------------------------------

def _minilm():
    from gradfuse.embedding.encoder import load_encoder

    return load_encoder("all-MiniLM-L6-v2")


def test_a_langchain_retriever_over_its_own_store_is_a_source(tmp_path):
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import InMemoryVectorStore

    encoder = _minilm()

    class MiniLM(Embeddings):  # the store's own embeddings: the real model, through LangChain's interface
        def embed_documents(self, texts):
            return encoder.encode(texts).tolist()

        def embed_query(self, text):
            return encoder.encode_query(text).tolist()

    store = InMemoryVectorStore(MiniLM())
    store.add_documents([Document(page_content=r["text"], id=r["id"], metadata={"title": r["title"]})
                         for r in ASTRONOMY])
    ws = Workspace(load_config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    ws.add_source("notes", store.as_retriever(search_kwargs={"k": 3}))
    assert ws.source_names() == ["cooking", "notes"]
    result = ws.search("the largest gas giant", method="select", k=3)
    top = result.candidates[0]
    assert (top.source, top.doc_id, top.title) == ("notes", "jupiter", "Jupiter") and not result.failures


def test_a_llamaindex_retriever_is_a_source_and_a_failing_one_fails_alone(tmp_path):
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.embeddings import BaseEmbedding

    encoder = _minilm()

    class MiniLM(BaseEmbedding):
        def _get_query_embedding(self, query):
            return encoder.encode_query(query).tolist()

        def _get_text_embedding(self, text):
            return encoder.encode([text])[0].tolist()

        async def _aget_query_embedding(self, query):
            return self._get_query_embedding(query)

    index = VectorStoreIndex.from_documents(
        [Document(text=r["text"], id_=r["id"], metadata={"title": r["title"]}) for r in ASTRONOMY],
        embed_model=MiniLM())

    class Broken(BaseRetriever):
        def _retrieve(self, query_bundle):
            raise ConnectionError("the vector store went away")

    ws = Workspace(load_config(workspace=tmp_path / "ws"))
    ws.add_source("planets", index.as_retriever(similarity_top_k=2))
    ws.add_source("broken", Broken())
    result = ws.search("Which planet has a thick carbon dioxide atmosphere?", method="rrf", k=2)
    assert [f.source for f in result.failures] == ["broken"] and "went away" in result.failures[0].detail
    top = result.candidates[0]
    assert top.source == "planets" and top.parent_id == "venus" and top.title == "Venus"
    with pytest.raises(TypeError, match="not a LangChain or LlamaIndex"):
        ws.add_source("other", object())


# --- vector stores, each written by its own client with its own vectors -----------------------------------------

PLANETS = ASTRONOMY + [{"id": "saturn", "title": "Saturn", "text": "Saturn has bright rings of ice and rock."}]


def _config(tmp_path, table: str) -> Workspace:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "gradfuse.toml").write_text(f'workspace = "ws"\n\n[sources.store]\n{table}')
    ws = Workspace.open(tmp_path / "gradfuse.toml")
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    return ws


def test_a_lancedb_table_made_by_its_own_client_is_a_source_by_vector_text_or_both(tmp_path):
    lancedb = pytest.importorskip("lancedb")
    from lancedb.index import FTS

    vectors = _minilm().encode([r["text"] for r in PLANETS])
    import pyarrow as pa

    schema = pa.schema([("doc", pa.string()), ("body", pa.string()), ("heading", pa.string()),
                        ("vec", pa.list_(pa.float32(), len(vectors[0])))])  # a vector column by another name
    db = lancedb.connect(str(tmp_path / "lance"))
    table = db.create_table("notes", [{"doc": r["id"], "body": r["text"], "heading": r["title"], "vec": v.tolist()}
                                      for r, v in zip(PLANETS, vectors)], schema=schema)
    table.create_index("body", config=FTS())
    ws = _config(tmp_path / "a", f'kind = "lancedb"\nuri = "{tmp_path / "lance"}"\ntable = "notes"\n'
                                 'id_field = "doc"\ntext_field = "body"\ntitle_field = "heading"\nvector_field = "vec"\n')
    for retrieval in ("dense", "bm25", "hybrid"):
        found = ws.search("icy rings", sources=["store"], method="single:store", retrieval=retrieval, k=3)
        top = found.candidates[0]
        assert (top.doc_id, top.title) == ("saturn", "Saturn") and not found.failures, retrieval
    dense = ws.search("icy rings", sources=["store"], method="single:store", retrieval="dense", k=3).candidates
    assert [c.native_score for c in dense] == sorted((c.native_score for c in dense), reverse=True)  # negated
    hybrid = ws.search("icy rings", sources=["store"], method="single:store", retrieval="hybrid", k=1)
    assert set(hybrid.candidates[0].retrieval_ranks) == {"bm25", "dense"}
    assert dict((n, s) for n, s, _ in ws.source_health())["store"].documents == len(PLANETS)

    wrong = _config(tmp_path / "b", f'kind = "lancedb"\nuri = "{tmp_path / "lance"}"\ntable = "notes"\n'
                                    'vector_field = "vec"\n')  # its id and text are in other fields
    result = wrong.search("icy rings", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["store"] and "has no field 'id'" in result.failures[0].detail
    missing = _config(tmp_path / "c", f'kind = "lancedb"\nuri = "{tmp_path / "lance"}"\ntable = "gone"\n')
    result = missing.search("pasta", method="rrf", k=3)
    assert "table 'gone' cannot be opened" in result.failures[0].detail and result.candidates


def test_a_qdrant_collection_in_local_mode_is_a_source_with_distances_made_similarities(tmp_path):
    pytest.importorskip("qdrant_client")
    from qdrant_client import QdrantClient, models

    vectors = _minilm().encode([r["text"] for r in PLANETS])
    client = QdrantClient(path=str(tmp_path / "qdrant"))
    client.create_collection("notes", vectors_config=models.VectorParams(size=len(vectors[0]),
                                                                         distance=models.Distance.EUCLID))
    client.upsert("notes", [models.PointStruct(id=i, vector=v.tolist(), payload={"name": r["id"], "text": r["text"],
                                                                                 "title": r["title"]})
                            for i, (r, v) in enumerate(zip(PLANETS, vectors))])
    client.close()  # the embedded mode: one client at a time
    ws = _config(tmp_path / "a", f'kind = "qdrant"\nuri = "{tmp_path / "qdrant"}"\ncollection = "notes"\n'
                                 'id_field = "name"\ntitle_field = "title"\n')
    found = ws.search("the hottest planet with a thick atmosphere", sources=["store"], method="single:store", k=3)
    assert [c.doc_id for c in found.candidates][:1] == ["venus"] and not found.failures
    scores = [c.native_score for c in found.candidates]
    assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)  # Euclid distances, negated
    missing = _config(tmp_path / "b", f'kind = "qdrant"\nuri = "{tmp_path / "qdrant"}"\ncollection = "gone"\n')
    result = missing.search("pasta", method="rrf", k=3)
    assert "collection 'gone' cannot be read" in result.failures[0].detail and result.candidates


# --- a sample of an engine's passages, read through its own client (what routing summarises) ------------------------

# 40 passages in order, every seventh without a title; `n` is each one's place, for the engines' own filters
SAMPLED = [{"id": f"p{n:02}", "title": f"Topic {n % 5}" if n % 7 else "", "text": f"Passage {n} on topic {n % 5}.",
            "n": n} for n in range(40)]


def _sample_vectors():
    import numpy as np

    return np.random.default_rng(0).random((len(SAMPLED), 8)).tolist()  # sampling reads no vectors: any will do


def _embedding_texts(rows) -> list[str]:
    from gradfuse.embedding.encoder import embedding_text

    return [embedding_text(r["title"], r["text"]) for r in rows]


def _assert_samples(source, *, first: int, spread: bool) -> None:
    """`source` holds SAMPLED's first `first` passages: a sample of 10 is 10 of their embedding texts (spread over
    them, into the last quarter, where the engine reads by offset) and a limit past the count returns them all."""
    texts = _embedding_texts(SAMPLED[:first])
    count, sample = source.sample_texts(10)
    assert count == first and len(sample) == len(set(sample)) == 10 and set(sample) <= set(texts)
    if spread:
        assert set(sample) & set(texts[-(first // 4):])  # not the first rows only
    count, everything = source.sample_texts(first + 5)
    assert count == first and sorted(everything) == sorted(texts)


def test_a_lancedb_table_and_a_qdrant_and_milvus_collection_sample_their_own_passages(tmp_path):
    pytest.importorskip("lancedb")
    import lancedb
    from pymilvus import MilvusClient
    from qdrant_client import QdrantClient, models

    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.lance_table import LanceSettings
    from gradfuse.sources.milvus_collection import MilvusSettings
    from gradfuse.sources.qdrant_collection import QdrantSettings

    vectors = _sample_vectors()
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{**r, "vector": v} for r, v in zip(SAMPLED, vectors)])
    qdrant = QdrantClient(path=str(tmp_path / "qdrant"))
    qdrant.create_collection("notes", vectors_config=models.VectorParams(size=8, distance=models.Distance.COSINE))
    qdrant.upsert("notes", [models.PointStruct(id=r["n"], vector=v, payload={**r, "name": r["id"]})
                            for r, v in zip(SAMPLED, vectors)])
    qdrant.close()  # the embedded mode: one client at a time
    milvus = MilvusClient(str(tmp_path / "milvus.db"))
    milvus.create_collection("notes", dimension=8, id_type="string", max_length=64, vector_field_name="emb")
    milvus.insert("notes", [{"id": r["id"], "emb": v, "body": r["text"], "heading": r["title"], "n": r["n"]}
                            for r, v in zip(SAMPLED, vectors)])
    milvus.close()
    stores = {"lancedb": (LanceSettings, dict(uri=str(tmp_path / "lance"), table="notes", title_field="title"),
                          "n < 20", True),
              "qdrant": (QdrantSettings, dict(uri=str(tmp_path / "qdrant"), collection="notes", id_field="name",
                                              title_field="title"),
                         {"must": [{"key": "n", "range": {"lt": 20}}]}, False),  # Qdrant draws at random
              "milvus": (MilvusSettings, dict(uri=str(tmp_path / "milvus.db"), collection="notes", text_field="body",
                                              title_field="heading", vector_field="emb"), "n < 20", True)}
    for settings, fields, first_half, spread in stores.values():
        for only, first in (("", len(SAMPLED)), (first_half, 20)):  # the whole collection, then what `filter` keeps
            source = open_engine("store", settings(**fields, filter=only), 10.0, "dense")
            _assert_samples(source, spread=spread, first=first)
            getattr(source, "close", lambda: None)()


def test_a_chroma_collection_samples_its_own_passages_through_its_server(chroma_server):
    import chromadb

    from gradfuse.sources.chroma_collection import ChromaSettings
    from gradfuse.sources.engines import open_engine

    url, _, port = chroma_server
    chromadb.HttpClient(host="127.0.0.1", port=port).create_collection("sampled", embedding_function=None).add(
        ids=[r["id"] for r in SAMPLED], documents=[r["text"] for r in SAMPLED], embeddings=_sample_vectors(),
        metadatas=[{"n": r["n"], **({"name": r["title"]} if r["title"] else {})} for r in SAMPLED])
    for only, first in (("", len(SAMPLED)), ({"n": {"$lt": 20}}, 20)):
        source = open_engine("store", ChromaSettings(uri=url, collection="sampled", title_field="name", filter=only),
                             10.0, "dense")
        _assert_samples(source, spread=True, first=first)


# --- a change seen by its marker: what makes an engine's routing summary again before refresh_s (before the
# tests that pause and kill the Chroma server) ---------------------------------------------------------------------

def test_each_engine_s_change_marker_moves_when_its_own_client_adds_a_record(tmp_path, chroma_server):
    pytest.importorskip("lancedb")
    import chromadb
    import lancedb
    from pymilvus import MilvusClient
    from qdrant_client import models

    from gradfuse.sources.chroma_collection import ChromaSettings
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.lance_table import LanceSettings
    from gradfuse.sources.milvus_collection import MilvusSettings
    from gradfuse.sources.qdrant_collection import QdrantSettings

    vectors = _sample_vectors()
    lance = lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{**r, "vector": v} for r, v in zip(SAMPLED, vectors)])
    _, _, port = chroma_server
    chroma = chromadb.HttpClient(host="127.0.0.1", port=port).create_collection("marked", embedding_function=None)
    chroma.add(ids=[r["id"] for r in SAMPLED], documents=[r["text"] for r in SAMPLED], embeddings=vectors)
    milvus = MilvusClient(str(tmp_path / "milvus.db"))
    milvus.create_collection("notes", dimension=8, id_type="string", max_length=64)
    milvus.insert("notes", [{"id": r["id"], "vector": v, "text": r["text"]} for r, v in zip(SAMPLED, vectors)])
    milvus.close()
    from qdrant_client import QdrantClient

    client = QdrantClient(path=str(tmp_path / "qdrant"))
    client.create_collection("notes", vectors_config=models.VectorParams(size=8, distance=models.Distance.COSINE))
    client.upsert("notes", [models.PointStruct(id=r["n"], vector=v, payload={**r, "name": r["id"]})
                            for r, v in zip(SAMPLED, vectors)])
    client.close()  # the embedded mode: one client at a time (the source's, which the test writes through)
    qdrant = open_engine("store", QdrantSettings(uri=str(tmp_path / "qdrant"), collection="notes", id_field="name"),
                         10.0, "dense")

    def add_to(kind: str, source) -> None:  # one more record, by the engine's own client
        new, vector = {"id": "p99", "title": "", "text": "Passage 99.", "n": 99}, [0.5] * 8
        if kind == "lancedb":
            lancedb.connect(str(tmp_path / "lance")).open_table("notes").add([{**new, "vector": vector}])
        elif kind == "chroma":
            chroma.add(ids=["p99"], documents=["Passage 99."], embeddings=[vector])
        elif kind == "milvus":
            source._client.insert("notes", [{"id": "p99", "vector": vector, "text": "Passage 99."}])
        else:
            source._client.upsert("notes", [models.PointStruct(id=99, vector=vector, payload={"name": "p99",
                                                                                             "text": "Passage 99."})])

    sources = {"lancedb": open_engine("store", LanceSettings(uri=str(tmp_path / "lance"), table="notes"), 10.0,
                                      "dense"),
               "chroma": open_engine("store", ChromaSettings(uri=f"http://127.0.0.1:{port}", collection="marked"),
                                     10.0, "dense"),
               "milvus": open_engine("store", MilvusSettings(uri=str(tmp_path / "milvus.db"), collection="notes"),
                                     10.0, "dense"),
               "qdrant": qdrant}
    for kind, source in sources.items():
        before = source.change_marker()
        assert source.change_marker() == before, kind  # reading it changes nothing
        add_to(kind, source)
        deadline = time.monotonic() + 30  # LanceDB looks for other writers' versions every 5 s
        while source.change_marker() == before:
            assert time.monotonic() < deadline, f"{kind}: the marker did not move"
            time.sleep(0.2)
    lance.add([{"id": "p98", "title": "", "text": "Passage 98.", "n": 98, "vector": [0.1] * 8}])
    found = sources["lancedb"]  # and its searches see the other writer's rows too, not only its marker
    deadline = time.monotonic() + 30
    while found.sample_texts(100)[0] != len(SAMPLED) + 2:
        assert time.monotonic() < deadline, "the lancedb source never saw rows another client added"
        time.sleep(0.2)
    getattr(sources["milvus"], "close", lambda: None)()


def test_an_engine_s_summary_is_made_again_when_its_marker_moves_before_refresh_s(tmp_path):
    pytest.importorskip("lancedb")
    import lancedb

    vectors = _minilm().encode([r["text"] for r in PLANETS])
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{**r, "vector": v.tolist()} for r, v in zip(PLANETS, vectors)])
    ws = _config(tmp_path / "a", f'kind = "lancedb"\nuri = "{tmp_path / "lance"}"\ntable = "notes"\n\n'
                                 '[routing]\ncheck_s = 0.5\nrefresh_s = 86400\n')
    summaries = ws.catalog.summaries
    assert summaries.make(["store"]) == {"store": ""}
    assert summaries.get("store")[0].documents == len(PLANETS)
    more = [{"id": f"moon-{n}", "title": "Moons", "text": f"Moon {n} circles a gas giant."} for n in range(3)]
    lancedb.connect(str(tmp_path / "lance")).open_table("notes").add(
        [{**r, "vector": v.tolist()} for r, v in zip(more, _minilm().encode([r["text"] for r in more]))])
    deadline = time.monotonic() + 60
    while summaries.get("store")[0].documents != len(PLANETS) + 3:
        assert time.monotonic() < deadline, "the summary was not made again after the table changed"
        time.sleep(0.2)
    marker = next((tmp_path / "a" / "ws" / "cache" / "summaries").glob("store-*.marker")).read_text()
    assert marker == str(lancedb.connect(str(tmp_path / "lance")).open_table("notes").version)


def test_a_sample_its_engine_refuses_fails_as_the_sources_error(tmp_path):
    pytest.importorskip("lancedb")
    import lancedb

    from gradfuse.sources.base import SourceError
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.lance_table import LanceSettings

    lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{**r, "vector": v} for r, v in zip(SAMPLED, _sample_vectors())])
    wrong = open_engine("store", LanceSettings(uri=str(tmp_path / "lance"), table="notes", filter="no_column = 1"),
                        10.0, "dense")  # opens: LanceDB reads the filter only when asked
    with pytest.raises(SourceError, match="table 'notes' cannot be sampled .*no_column"):
        wrong.sample_texts(10)


def test_a_paused_chroma_server_fails_its_source_within_its_timeout_opening_or_asking(tmp_path, chroma_server):
    """Round 5: with `chroma run` paused by SIGSTOP, `/search` with `timeout_s: 2` and `GET /sources` hung past 40 s
    (Chroma's client has no timeout, and opening a source had no deadline)."""
    import signal

    import chromadb

    url, process, port = chroma_server
    client = chromadb.HttpClient(host="127.0.0.1", port=port)
    client.create_collection("paused", embedding_function=None).add(
        ids=["mars"], documents=[PLANETS[0]["text"]], embeddings=_minilm().encode([PLANETS[0]["text"]]).tolist())
    asked = _config(tmp_path / "asked", f'kind = "chroma"\nuri = "{url}"\ncollection = "paused"\ntimeout_s = 2\n')
    assert not asked.search("planet", method="rrf", k=2).failures  # opened and answering
    unopened = _config(tmp_path / "unopened", f'kind = "chroma"\nuri = "{url}"\ncollection = "paused"\n'
                                              'timeout_s = 2\n')
    process.send_signal(signal.SIGSTOP)
    try:
        for ws, reason in ((asked, "no answer within 2 s"), (unopened, "not opened within 2 s")):
            result = ws.search("planet", method="rrf", k=2)
            assert [(f.source, f.reason) for f in result.failures] == [("store", "timeout")] and result.candidates
            assert reason in result.failures[0].detail
            health = dict((name, error) for name, _, error in ws.source_health())
            assert health["cooking"] is None and "store" in health and health["store"]
            # the client's own timeout ends the calls while the server is still paused: no thread is held
            deadline = time.monotonic() + 30
            while ws.guards["store"].late:
                assert time.monotonic() < deadline, "a call to the paused server never returned"
                time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGCONT)
    assert not asked.search("planet", method="rrf", k=2).failures


def test_a_chroma_collection_on_its_server_is_a_source_and_fails_alone_when_the_server_dies(tmp_path, chroma_server):
    import chromadb

    url, process, port = chroma_server
    vectors = _minilm().encode([r["text"] for r in PLANETS])
    client = chromadb.HttpClient(host="127.0.0.1", port=port)
    client.create_collection("planets", metadata={"hnsw:space": "cosine"}, embedding_function=None).add(
        ids=[r["id"] for r in PLANETS], documents=[r["text"] for r in PLANETS], embeddings=vectors.tolist(),
        metadatas=[{"name": r["title"]} for r in PLANETS])
    ws = _config(tmp_path / "a", f'kind = "chroma"\nuri = "{url}"\ncollection = "planets"\ntitle_field = "name"\n')
    found = ws.search("icy rings", sources=["store"], method="single:store", k=3)
    top = found.candidates[0]
    assert (top.doc_id, top.title) == ("saturn", "Saturn") and not found.failures
    scores = [c.native_score for c in found.candidates]
    assert scores == sorted(scores, reverse=True) and max(scores) <= 0  # cosine distances, negated
    assert dict((n, s) for n, s, _ in ws.source_health())["store"].documents == len(PLANETS)
    assert top.score_kind == "-cosine distance" and top.metadata == {}
    missing = _config(tmp_path / "b", f'kind = "chroma"\nuri = "{url}"\ncollection = "gone"\n')
    assert "collection 'gone' cannot be read" in missing.search("pasta", method="rrf", k=3).failures[0].detail
    only = _config(tmp_path / "c", f'kind = "chroma"\nuri = "{url}"\ncollection = "planets"\n'
                                   'metadata_fields = ["name"]\nfilter = { name = { "$in" = ["Mars", "Venus"] } }\n')
    found = only.search("icy rings", sources=["store"], method="single:store", k=3).candidates
    assert sorted(c.metadata["name"] for c in found) == ["Mars", "Venus"]  # Chroma's own `where`

    process.kill()  # the engine goes away between two questions: that source fails, the rest answer
    process.wait()
    after = ws.search("pasta with mushrooms", method="rrf", k=3)
    assert [f.source for f in after.failures] == ["store"] and after.candidates


def test_a_milvus_lite_collection_is_a_source_with_its_own_fields(tmp_path):
    pytest.importorskip("pymilvus")
    from pymilvus import MilvusClient

    vectors = _minilm().encode([r["text"] for r in PLANETS])
    path = tmp_path / "milvus.db"
    client = MilvusClient(str(path))
    client.create_collection("planets", dimension=len(vectors[0]), metric_type="L2", id_type="string",
                             max_length=64, vector_field_name="emb")
    client.insert("planets", [{"id": r["id"], "emb": v.tolist(), "body": r["text"], "heading": r["title"]}
                              for r, v in zip(PLANETS, vectors)])
    client.release_collection("planets")  # as a reopened Lite file or a restarted server has it: not loaded
    client.close()
    ws = _config(tmp_path / "a", f'kind = "milvus"\nuri = "{path}"\ncollection = "planets"\ntext_field = "body"\n'
                                 'title_field = "heading"\nvector_field = "emb"\n')
    found = ws.search("icy rings", sources=["store"], method="single:store", k=3)
    top = found.candidates[0]
    assert (top.doc_id, top.title, top.text) == ("saturn", "Saturn", PLANETS[-1]["text"]) and not found.failures
    scores = [c.native_score for c in found.candidates]
    assert scores == sorted(scores, reverse=True) and max(scores) <= 0  # L2 distances, negated
    missing = _config(tmp_path / "b", f'kind = "milvus"\nuri = "{tmp_path / "other.db"}"\ncollection = "gone"\n')
    assert "collection 'gone' cannot be read" in missing.search("pasta", method="rrf", k=3).failures[0].detail


# --- metadata, filters, malformed rows, and engines in a benchmark ------------------------------------------------

SHELF = [{**r, "kind": kind, "year": year} for r, kind, year in
         zip(PLANETS, ["rocky", "gas", "rocky", "gas"], [2019, 2020, 2021, 2022])]


def test_metadata_fields_and_each_engines_own_filter_reach_the_passages(tmp_path):
    pytest.importorskip("lancedb")
    import lancedb
    from pymilvus import MilvusClient
    from qdrant_client import QdrantClient, models

    vectors = _minilm().encode([r["text"] for r in SHELF])
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{**r, "vector": v.tolist()} for r, v in zip(SHELF, vectors)])
    qdrant = QdrantClient(path=str(tmp_path / "qdrant"))
    qdrant.create_collection("notes", vectors_config=models.VectorParams(size=len(vectors[0]),
                                                                         distance=models.Distance.COSINE))
    qdrant.upsert("notes", [models.PointStruct(id=i, vector=v.tolist(), payload=r)
                            for i, (r, v) in enumerate(zip(SHELF, vectors))])
    qdrant.close()
    milvus = MilvusClient(str(tmp_path / "milvus.db"))
    milvus.create_collection("notes", dimension=len(vectors[0]), metric_type="COSINE", id_type="string",
                             max_length=64)
    milvus.insert("notes", [{**r, "vector": v.tolist()} for r, v in zip(SHELF, vectors)])
    milvus.close()
    stores = {"lancedb": ('table = "notes"', 'filter = "kind = \'gas\'"', "-l2 distance"),
              "qdrant": ('collection = "notes"\nid_field = "id"',
                         'filter = { must = [{ key = "kind", match = { value = "gas" } }] }', "cosine"),
              "milvus": ('collection = "notes"', 'filter = "kind == \\"gas\\""', "cosine")}
    where = {"lancedb": "lance", "qdrant": "qdrant", "milvus": "milvus.db"}
    for kind, (collection, only_gas, score_kind) in stores.items():
        common = f'kind = "{kind}"\nuri = "URI"\n{collection}\nmetadata_fields = ["kind", "year"]\n'
        ws = _config(tmp_path / kind, common.replace("URI", f"../{where[kind]}"))  # relative to gradfuse.toml
        top = ws.search("icy rings", sources=["store"], method="single:store", k=4).candidates
        assert (top[0].doc_id, top[0].metadata, top[0].score_kind) == ("saturn", {"kind": "gas", "year": 2022},
                                                                       score_kind), kind
        assert "title" not in top[0].metadata  # only the fields named
        filtered = _config(tmp_path / f"{kind}-gas", common.replace("URI", str(tmp_path / where[kind])) + only_gas + "\n")
        found = filtered.search("the hottest rocky planet", sources=["store"], method="single:store", k=4)
        assert not found.failures and {c.metadata["kind"] for c in found.candidates} == {"gas"}, kind
        assert {c.doc_id for c in found.candidates} == {"jupiter", "saturn"}, kind


def test_a_filter_in_the_wrong_language_is_refused_when_the_file_is_read(tmp_path):
    config = tmp_path / "gradfuse.toml"
    config.write_text('[sources.store]\nkind = "lancedb"\nuri = "lance"\ntable = "t"\nfilter = { kind = "gas" }\n')
    with pytest.raises(ConfigError, match="filter must be text"):
        load_config(config)
    config.write_text('[sources.store]\nkind = "qdrant"\nuri = "q"\ncollection = "t"\nfilter = "kind = 1"\n')
    with pytest.raises(ConfigError, match="filter must be a table"):
        load_config(config)


def test_a_whole_document_an_engine_returns_is_cut_to_max_passage_chars_and_reported_as_cut(tmp_path):
    """Engines return documents whole (never chunked here): one of 150 KB made /ask take 49.8 s and an unrelated
    /ask 13.1 s. It is cut on its source's workers, so every later step is bounded, and says how long it was."""
    pytest.importorskip("lancedb")
    import lancedb

    from gradfuse.schemas import candidate_record

    storms = " ".join(f"Storm {i} on Jupiter lasted {i % 90 + 3} days and spun against its neighbours."
                      for i in range(2500))[:150_000]
    rows = PLANETS + [{"id": "jupiter-log", "title": "Jupiter storms", "text": storms}]
    vectors = _minilm().encode([r["text"][:2000] for r in rows])
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{"id": r["id"], "text": r["text"], "vector": v.tolist()} for r, v in zip(rows, vectors)])
    table = f'kind = "lancedb"\nuri = "{tmp_path / "lance"}"\ntable = "notes"\n'
    for folder, guard, bound in (("a", "", 20_000), ("b", "\n[guard]\nmax_passage_chars = 5000\n", 5000)):
        ws = _config(tmp_path / folder, table + guard)
        found = ws.search("How long did the storms on Jupiter last?", sources=["store"], method="single:store", k=3)
        long, = [c for c in found.candidates if c.doc_id == "jupiter-log"]
        assert bound * 0.9 <= len(long.text) <= bound and storms.startswith(long.text), folder
        assert long.cut_from == 150_000 and candidate_record(long).cut_from == 150_000
        assert all(c.cut_from is None for c in found.candidates if c is not long)  # short ones are whole


def test_malformed_rows_fail_their_source_alone_with_the_reason(tmp_path):
    pytest.importorskip("lancedb")
    import lancedb

    vectors = _minilm().encode([r["text"] for r in PLANETS])
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "numbers", [{"id": r["id"], "text": len(r["text"]), "vector": v.tolist()} for r, v in zip(PLANETS, vectors)])
    ws = _config(tmp_path / "a", f'kind = "lancedb"\nuri = "{tmp_path / "lance"}"\ntable = "numbers"\n')
    result = ws.search("icy rings", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["store"] and "holds int, not text" in result.failures[0].detail
    assert result.candidates and all(c.source == "cooking" for c in result.candidates)


def test_a_benchmark_runs_with_a_source_an_engine_serves_and_without_it(tmp_path, monkeypatch):
    """`[engines.NAME]` in a benchmark file: gradfuse eval asks the engine; dropping the table gives the
    all-embedded baseline over the same data."""
    from dataclasses import replace

    import lancedb

    from gradfuse.eval.benchmark import load_benchmark
    from gradfuse.eval.runner import run_benchmark

    monkeypatch.delenv("GRADFUSE_DATA", raising=False)  # the file's own data folder, not the shared one
    data = tmp_path / "data"
    for name, records in (("astronomy", PLANETS), ("cooking", COOKING)):
        write_jsonl(data / name / "corpus.jsonl", records)
    write_jsonl(data / "astronomy" / "queries.jsonl", [{"id": "q1", "text": "icy rings"},
                                                        {"id": "q2", "text": "moons Phobos and Deimos"},
                                                        {"id": "q3", "text": "the largest gas giant"},
                                                        {"id": "q4", "text": "the hottest planet's surface"}])
    (data / "astronomy" / "qrels.tsv").write_text("q1\tsaturn\t1\nq2\tmars\t1\nq3\tjupiter\t1\nq4\tvenus\t1\n")
    vectors = _minilm().encode([f"{r['title']}\n{r['text']}" for r in PLANETS])
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "planets", [{**r, "vector": v.tolist()} for r, v in zip(PLANETS, vectors)])
    file = tmp_path / "bench" / "b.toml"
    file.parent.mkdir()
    file.write_text(f'data = "{data}"\nworkspace = "../ws"\nretrieval = "dense"\ndepth = 5\nk = 5\n'
                    'methods = ["single:*", "rrf", "concat", "select"]\n[split]\nsample = 2\ndev = 2\n'
                    '[sources.astronomy]\nkind = "beir"\npath = "astronomy"\n'
                    '[sources.cooking]\nkind = "jsonl"\npath = "cooking/corpus.jsonl"\n'
                    '[engines.astronomy]\nkind = "lancedb"\nuri = "../lance"\ntable = "planets"\ntitle_field = "title"\n'
                    '[queries.astronomy]\npath = "astronomy"\n')
    bench = load_benchmark(file)
    assert bench.source_names == ["astronomy", "cooking"] and bench.engines["astronomy"].uri == str(tmp_path / "lance")
    in_engine = run_benchmark(bench, progress=False)
    assert not in_engine.failures and [b["name"] for b in in_engine.builds] == ["cooking"]
    first = {q: o.ranking[0][0] for q, o in in_engine.outcomes["select"].items()}
    relevant = {q: next(iter(judged)) for q, judged in in_engine.qrels.items()}
    assert len(first) == 4 and all(first[q] == relevant[q] for q in first)  # test and dev queries
    assert in_engine.passages["astronomy/saturn"][2] == "Saturn"  # the title came from the engine's field
    embedded = run_benchmark(replace(bench, engines={}, name="b-embedded"), progress=False)
    assert {b["name"] for b in embedded.builds} == {"astronomy", "cooking"}
    assert {q: o.ranking[0][0] for q, o in embedded.outcomes["select"].items()} == first


def test_select_over_an_engine_holds_its_candidates_vectors_in_memory_not_in_the_disk_cache(tmp_path):
    """M5: `select` embeds an engine's candidates (no index here holds them); they must not grow
    cache/embeddings.sqlite with every request."""
    pytest.importorskip("lancedb")
    import lancedb

    vectors = _minilm().encode([r["text"] for r in PLANETS])
    lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{"id": r["id"], "text": r["text"], "vector": v.tolist()} for r, v in zip(PLANETS, vectors)])
    ws = _config(tmp_path, f'kind = "lancedb"\nuri = "{tmp_path / "lance"}"\ntable = "notes"\n')
    disk = tmp_path / "ws" / "cache" / "embeddings.sqlite"
    before = sqlite3.connect(disk).execute("SELECT COUNT(*) FROM vectors").fetchone()
    found = ws.search("Which planet has rings of ice?", method="select", k=3)
    assert found.candidates[0].doc_id == "saturn"
    assert sqlite3.connect(disk).execute("SELECT COUNT(*) FROM vectors").fetchone() == before
    assert ws.query.embeddings.held >= len(PLANETS)
