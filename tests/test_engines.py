"""Sources that an engine serves in place, against the real engine: here another `gradfuse serve` (its own
process, its own workspace and key) declared as `kind = "gradfuse"` beside a local source. Search by text with
provenance kept, the remote's failure as this source's failure while the rest answers, a refused or missing key,
and settings that would put a secret in the file."""

from __future__ import annotations

import os

import pytest

from conftest import ASTRONOMY, COOKING, write_jsonl
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


def _local(tmp_path, url: str, **extra) -> Workspace:
    """A workspace with a local source (cooking) and the remote server as source `team`."""
    options = "".join(f"{key} = {value}\n" for key, value in extra.items())
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "gradfuse.toml"
    config.write_text(f'workspace = "ws"\n\n[sources.team]\nkind = "gradfuse"\nurl = "{url}"\n{options}')
    ws = Workspace.open(config)
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    return ws


def test_another_gradfuse_server_is_a_source_with_provenance_kept(remote, tmp_path, monkeypatch):
    monkeypatch.setenv("TEAM_KEY", KEY)
    ws = _local(tmp_path, remote, key_env='"TEAM_KEY"')
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
    refused = _local(tmp_path / "refused", remote, key_env='"TEAM_KEY"')
    result = refused.search("pasta", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["team"] and "refused the key in TEAM_KEY" in result.failures[0].detail
    assert result.candidates and all(c.source == "cooking" for c in result.candidates)
    assert "not-the-key" not in result.failures[0].detail

    monkeypatch.delenv("TEAM_KEY")
    unset = refused.search("pasta", method="rrf", k=3)
    assert "TEAM_KEY" in unset.failures[0].detail and "not set" in unset.failures[0].detail

    down = _local(tmp_path / "down", "http://127.0.0.1:9", timeout_s=2)  # nothing listens on the discard port
    result = down.search("pasta", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["team"] and "cannot be reached" in result.failures[0].detail
    assert result.candidates


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
    from gradfuse.sources.encoder import load_encoder

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
