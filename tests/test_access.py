"""Who may read what, tried from the outside (issue 43): two principals over real engines (a Chroma server, LanceDB,
Qdrant, PostgreSQL, a second gradfuse) and embedded sources (JSONL and files), every path a key reaches tried for
reading across. Every passage alice alone may read carries a marker ("ZQX"); bob's answers, on every path, must
hold none, nor the name of the source only alice may read ("hrvault"); a source bob may not read must look to him
exactly like one that does not exist. Alice's answers hold the markers: the probe can see a leak."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from pathlib import Path

import httpx
import pytest
from conftest import write_jsonl
from live_server import gradfuse_serve, serving

from gradfuse import Workspace
from gradfuse.access import EVERYTHING, Principal
from gradfuse.access.keys import AccessSettings, KeyRing, PrincipalSettings, key_hash
from gradfuse.candidate import Candidate
from gradfuse.config import Config
from gradfuse.server.app import create_app
from gradfuse.sources import SourceSpec
from gradfuse.federation.federated import AllSourcesFailed, query_sources
from gradfuse.federation.guard import GuardSettings, Guards
from gradfuse.sources.local_postgres import LocalPostgres

ALICE_KEY, BOB_KEY, PARTNER_KEY = "alice-key-for-tests", "bob-key-for-tests", "partner-key-for-tests"
QUESTION = "How are salaries reviewed and paid through payroll?"
MARK = "ZQX"
# hr's passages (the best matches for the question), each with a marker; and passages for everyone
HR = [f"{text} Ref {MARK}{n}." for n, text in enumerate([
    "Salaries are reviewed every April and paid through payroll on the last working day.",
    "Payroll pays each salary monthly; salary reviews follow the yearly appraisal.",
    "The salary review sets each band's pay; payroll applies it from the next month.",
    "Overtime is paid through payroll with the salary of the following month.",
])]
OPEN = ["The office kitchen is cleaned on Fridays by cleaners the agency has paid.",
        "Visitors sign in at the front desk; parking is paid at the gate.",
        "The library lends books for three weeks; late fees are paid at its desk.",
        "Code review needs one approval from another engineer before a merge."]
BOBS = ["handbook", "wiki", "pg", "lance", "qdrant", "chroma", "team"]  # every source but hrvault


def _records(prefix: str, restricted: bool = True) -> list[dict]:
    return ([{"id": f"{prefix}-hr{n}", "text": t, **({"readers": ["hr"]} if restricted else {})}
             for n, t in enumerate(HR)] + [{"id": f"{prefix}-open{n}", "text": t} for n, t in enumerate(OPEN)])


def _vectors(texts):
    from gradfuse.embedding.encoder import load_encoder

    return load_encoder("all-MiniLM-L6-v2").encode(texts).tolist()


def _engines(root: Path, chroma_port: int) -> None:
    """A LanceDB table, a Qdrant collection (local folder) and a Chroma collection, each made by its own client."""
    import chromadb
    import lancedb
    import pyarrow as pa
    from qdrant_client import QdrantClient, models

    rows = _records("e")
    vectors = _vectors([r["text"] for r in rows])
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("readers", pa.list_(pa.string())),
                        ("vector", pa.list_(pa.float32(), len(vectors[0])))])
    lancedb.connect(str(root / "lance")).create_table(
        "notes", [{**r, "readers": r.get("readers"), "vector": v} for r, v in zip(rows, vectors)], schema=schema)
    client = QdrantClient(path=str(root / "qdrant"))
    client.create_collection("notes", vectors_config=models.VectorParams(size=len(vectors[0]),
                                                                         distance=models.Distance.COSINE))
    client.upsert("notes", [models.PointStruct(id=n, vector=v, payload=r) for n, (r, v) in enumerate(zip(rows, vectors))])
    client.close()
    chromadb.HttpClient(host="127.0.0.1", port=chroma_port).create_collection(
        "notes", metadata={"hnsw:space": "cosine"}, embedding_function=None).add(
        ids=[r["id"] for r in rows], documents=[r["text"] for r in rows], embeddings=vectors,
        metadatas=[{"readers": r.get("readers", ["*"])} for r in rows])  # Chroma: ["*"] is everyone


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A second gradfuse whose key for us stands for `partner` there, who may not read its hr passages."""
    root = tmp_path_factory.mktemp("remote")
    (root / "gradfuse.toml").write_text('workspace = "ws"\n[access.principals.partner]\nkey_env = "PARTNER_KEY"\n'
                                        'groups = ["partners"]\nsources = ["*"]\n')
    Workspace.open(root / "gradfuse.toml").index(SourceSpec("remotehr", "jsonl",
                                                            str(write_jsonl(root / "r.jsonl", _records("r")))))
    with gradfuse_serve(root / "ws", "--config", str(root / "gradfuse.toml"), env={"PARTNER_KEY": PARTNER_KEY}) as url:
        yield url


@pytest.fixture(scope="module")
def served(tmp_path_factory, chroma_server, remote):
    """The workspace (every kind) served with alice (hr, every source; in the config) and bob (eng, every source
    but hrvault; in a key file)."""
    root = tmp_path_factory.mktemp("access")
    chroma_url, _, chroma_port = chroma_server
    _engines(root, chroma_port)
    write_jsonl(root / "handbook.jsonl", _records("h"))
    write_jsonl(root / "hrvault.jsonl", _records("v", restricted=False))
    (root / "wiki" / "hr").mkdir(parents=True)
    (root / "wiki" / "public").mkdir()
    (root / "wiki" / "hr" / "pay.md").write_text("# Pay\n\n" + " ".join(HR) + "\n")
    (root / "wiki" / "public" / "office.md").write_text("# Office\n\n" + " ".join(OPEN) + "\n")
    (root / "keys.toml").write_text(f'[principals.bob]\nkey_sha256 = "{key_hash(BOB_KEY)}"\ngroups = ["eng"]\n'
                                    f'sources = {json.dumps(BOBS)}\n')
    with LocalPostgres() as pg:
        (root / "gradfuse.toml").write_text(f"""workspace = "ws"
[routing]
above = 4
budget = 3
[access]
keys_file = "keys.toml"
[access.principals.alice]
key_env = "ALICE_KEY"
groups = ["hr"]
sources = ["*"]
[sources.handbook]
kind = "jsonl"
path = "handbook.jsonl"
[sources.hrvault]
kind = "jsonl"
path = "hrvault.jsonl"
[sources.wiki]
kind = "files"
path = "wiki"
[sources.wiki.readers]
"hr/*" = ["hr"]
[sources.lance]
kind = "lancedb"
uri = "lance"
table = "notes"
readers_field = "readers"
[sources.qdrant]
kind = "qdrant"
uri = "qdrant"
collection = "notes"
readers_field = "readers"
[sources.chroma]
kind = "chroma"
uri = "{chroma_url}"
collection = "notes"
readers_field = "readers"
[sources.team]
kind = "gradfuse"
url = "{remote}"
key_env = "TEAM_KEY"
""")
        os.environ.update(ALICE_KEY=ALICE_KEY, TEAM_KEY=PARTNER_KEY)
        try:
            ws = Workspace.open(root / "gradfuse.toml")
            ws.build_configured()
            ws.index(SourceSpec("pg", "jsonl", str(write_jsonl(root / "pg.jsonl", _records("p")))), into=pg.url)
            with serving(create_app(ws)) as url:
                yield url, ws
            ws.close()
        finally:
            for name in ("ALICE_KEY", "TEAM_KEY"):
                os.environ.pop(name, None)


def _as(key: str) -> dict:
    return {"X-API-Key": key}


def _post(url: str, path: str, body: dict, key: str) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=_as(key), timeout=300)


def _clean(reply: httpx.Response) -> str:
    """Bob's reply: no marker of hr's passages and no name of the source he may not read, anywhere in it."""
    assert MARK not in reply.text and "hrvault" not in reply.text, reply.text[:2000]
    return reply.text


def test_bob_reads_no_passage_of_hr_on_search_and_alice_does(served):
    url, _ = served
    for method in ("select", "rrf", "concat"):
        body = {"query": QUESTION, "k": 10, "method": method, "depth": 10}
        bobs = _post(url, "/search", body, BOB_KEY)
        assert bobs.status_code == 200, bobs.text
        _clean(bobs)
        found = bobs.json()
        assert found["candidates"] and not found["failures"], found["failures"]
        alices = _post(url, "/search", body, ALICE_KEY)
        assert MARK in alices.text  # the probe sees hr's passages where they may be read


def test_every_source_bob_names_answers_him_without_hr(served):
    url, _ = served
    for source in BOBS:
        reply = _post(url, "/search", {"query": QUESTION, "k": 4, "sources": [source], "method": "rrf"}, BOB_KEY)
        assert reply.status_code == 200, reply.text
        _clean(reply)
        readable = 1 if source == "wiki" else len(OPEN)  # the wiki's office page is one passage
        assert len(reply.json()["candidates"]) == readable, (source, reply.json())  # all that bob may read


def test_a_source_bob_may_not_read_is_refused_as_one_that_does_not_exist(served):
    url, _ = served
    for path, forbidden, missing in [
        ("/search", {"query": QUESTION, "sources": ["hrvault"]}, {"query": QUESTION, "sources": ["nosuch"]}),
        ("/search", {"query": QUESTION, "method": "single:hrvault"}, {"query": QUESTION, "method": "single:nosuch"}),
        ("/ask", {"query": QUESTION, "sources": ["hrvault"]}, {"query": QUESTION, "sources": ["nosuch"]}),
    ]:
        refused, unknown = _post(url, path, forbidden, BOB_KEY), _post(url, path, missing, BOB_KEY)
        assert refused.status_code == unknown.status_code == 422
        assert refused.text == unknown.text.replace("nosuch", "hrvault") or refused.json() == unknown.json()
        _clean(refused)
    summary = httpx.get(url + "/sources/hrvault/summary", headers=_as(BOB_KEY))
    assert (summary.status_code, summary.json()) == (
        (reply := httpx.get(url + "/sources/nosuch/summary", headers=_as(BOB_KEY))).status_code, reply.json())
    # a source he may read: its summary holds vectors of every document, so only a key that reads them all gets it
    assert httpx.get(url + "/sources/handbook/summary", headers=_as(BOB_KEY)).status_code == 404


def test_ask_and_its_evidence_citations_and_not_found_hold_nothing_of_hr(served):
    url, _ = served
    for question in (QUESTION, "What is the salary review reference code?", "How do submarines navigate?"):
        reply = _post(url, "/ask", {"query": question, "k": 5}, BOB_KEY)
        assert reply.status_code == 200, reply.text
        _clean(reply)
        streamed = _post(url, "/ask", {"query": question, "k": 5, "stream": True}, BOB_KEY)
        _clean(streamed)
    assert MARK in _post(url, "/ask", {"query": QUESTION, "k": 5}, ALICE_KEY).text


def test_the_openai_endpoint_with_earlier_turns_holds_nothing_of_hr(served):
    url, _ = served
    messages = [{"role": "user", "content": "Tell me about salaries and payroll reviews."},
                {"role": "assistant", "content": "Which part?"},
                {"role": "user", "content": QUESTION}]
    for stream in (False, True):
        reply = _post(url, "/v1/chat/completions", {"model": "gradfuse", "messages": messages, "stream": stream},
                      BOB_KEY)
        assert reply.status_code == 200, reply.text
        _clean(reply)


def test_sources_options_healthz_and_the_page_name_only_what_the_key_may_read(served):
    url, _ = served
    listed = httpx.get(url + "/sources", headers=_as(BOB_KEY))
    assert {s["name"] for s in listed.json()} == set(BOBS)
    _clean(listed)
    assert "hrvault" in {s["name"] for s in httpx.get(url + "/sources", headers=_as(ALICE_KEY)).json()}
    _clean(httpx.get(url + "/options", headers=_as(BOB_KEY)))
    health = httpx.get(url + "/healthz")  # no key: counts only, no source named
    assert health.status_code == 200 and not any(name in health.text for name in [*BOBS, "hrvault"])
    assert httpx.get(url + "/", headers=_as(BOB_KEY)).status_code == 200  # the page reads /sources with its key
    assert httpx.get(url + "/sources", headers=_as("not-a-key")).status_code == 401
    # Issue 58 L4: when a shared source last answered tells when the others used it: not to a limited key
    assert _post(url, "/search", {"query": QUESTION}, ALICE_KEY).status_code == 200
    listed = httpx.get(url + "/sources", headers=_as(BOB_KEY)).json()
    assert all(s["last_answered_at"] is None and s["last_failure_at"] is None for s in listed)
    # the metrics name every source: to a key that may read everything only
    assert httpx.get(url + "/metrics", headers=_as(BOB_KEY)).status_code == 404


def test_routing_tells_a_key_which_sources_were_asked_not_their_scores(served):
    url, _ = served
    found = _post(url, "/search", {"query": QUESTION, "k": 5}, BOB_KEY).json()
    assert len(found["routing"]["asked"]) >= 3 and set(found["routing"]["asked"]) <= set(BOBS)
    # a score is the best cosine to sampled passages of any document of the source: none is told
    assert found["routing"]["skipped"] == {} and not found["routing"].get("scores")


def test_the_cache_serves_no_key_what_another_read(served, monkeypatch):
    url, _ = served
    # The sources were built seconds ago: within 2 s of a publish the cache keys a result by its sources' versions,
    # after it by the folder's stamp, so a result kept across that moment is missed. Trust the stamp at once.
    monkeypatch.setattr("gradfuse.federation.catalog.STAMP_SETTLED_NS", 0)
    body = {"query": "When are salaries paid by payroll?", "k": 5, "sources": ["handbook", "wiki"]}  # built here: kept
    first = _post(url, "/search", body, ALICE_KEY)
    again = _post(url, "/search", body, ALICE_KEY)
    assert again.headers.get("X-Gradfuse-Cache") == "hit" and MARK in again.text  # kept for alice
    bobs = _post(url, "/search", body, BOB_KEY)
    assert bobs.headers.get("X-Gradfuse-Cache") != "hit" and bobs.text != first.text
    _clean(bobs)
    _clean(_post(url, "/search", body, BOB_KEY))  # and what bob got is kept for bob, still clean


def test_mcp_tools_and_resources_over_http_read_as_the_key(served):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    url, _ = served

    async def run(key: str) -> list[str]:
        transport = streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(
            headers={"Authorization": f"Bearer {key}"}))
        seen = []
        async with Client(transport, read_timeout_seconds=300) as client:
            for tool, arguments in [("search", {"query": QUESTION, "k": 8}), ("ask", {"question": QUESTION}),
                                    ("list_sources", {}), ("search", {"query": QUESTION, "sources": ["hrvault"]}),
                                    ("search", {"query": QUESTION, "sources": ["nosuch"]})]:
                result = await client.call_tool(tool, arguments)
                seen.append(result.content[0].text.replace("nosuch", "hrvault") if "nosuch" in str(arguments)
                            else result.content[0].text)
            for uri in ("gradfuse://handbook/h-hr0", "gradfuse://handbook/h-nosuch", "gradfuse://hrvault/v-open0",
                        "gradfuse://nosuch/v-open0", "gradfuse://handbook/h-open0"):
                try:
                    seen.append((await client.read_resource(uri)).contents[0].text)
                except Exception as error:  # the SDK raises the server's refusal
                    seen.append(str(error))
        return seen

    bobs = asyncio.run(run(BOB_KEY))
    for text in bobs[:3]:
        assert MARK not in text and "hrvault" not in text, text[:1000]
    assert bobs[3] == bobs[4]  # a source he may not read: as one that does not exist
    assert bobs[5] == bobs[6].replace("h-nosuch", "h-hr0")  # a passage he may not read: as one that does not exist
    assert bobs[7] == bobs[8].replace("nosuch", "hrvault")
    assert "kitchen" in bobs[9]
    alices = asyncio.run(run(ALICE_KEY))
    assert MARK in alices[0] and MARK in alices[5]


def test_a_remote_gradfuse_answers_as_the_principal_its_key_stands_for_there(served):
    url, ws = served
    for key in (ALICE_KEY, BOB_KEY):  # alice may read hr here, not through partner's key there
        reply = _post(url, "/search", {"query": QUESTION, "k": 4, "sources": ["team"], "method": "rrf"}, key)
        assert reply.status_code == 200 and MARK not in reply.text, reply.text[:1000]


def test_the_library_eval_and_tune_read_everything_as_before(served):
    _, ws = served
    result = ws.search(QUESTION, sources=["handbook", "hrvault"], method="rrf", k=4)
    assert all(MARK in c.text for c in result.candidates)
    bob = Principal("bob", frozenset({"eng"}), frozenset(BOBS))
    result = ws.search(QUESTION, sources=["handbook"], method="rrf", k=4, principal=bob)
    assert len(result.candidates) == 4 and not any(MARK in c.text for c in result.candidates)


def test_a_source_whose_filter_fails_is_told_and_none_of_its_passages_is_used():
    """The second check after every source: a store that returns what its caller may not read fails alone."""

    class Leaky:  # a store whose own filter is broken
        name = "leaky"

        def warm(self):
            pass

        def search(self, query, k, *, readers=None):
            return [Candidate("leaky", "secret", f"the payroll {MARK}", 1.0, 1, readers=("hr",))]

    class Honest(Leaky):
        name = "honest"

        def search(self, query, k, *, readers=None):
            return [Candidate("honest", "open", "the kitchen", 1.0, 1)]

    guards = Guards(GuardSettings())
    try:
        result = query_sources([Leaky(), Honest()], QUESTION, 5, {"leaky": 5, "honest": 5}, guards,
                               readers=frozenset({"bob"}))
        assert list(result.ranked_lists) == ["honest"] and result.failures[0].source == "leaky"
        assert "may not read" in result.failures[0].detail and MARK not in result.failures[0].detail
        for _ in range(guards.settings.breaker_failures):  # no caller opens its breaker for every other
            with pytest.raises(AllSourcesFailed):
                query_sources([Leaky()], QUESTION, 5, {"leaky": 5}, guards, readers=frozenset({"bob"}))
        assert guards.state("leaky") == "closed"
        assert query_sources([Leaky()], QUESTION, 5, {"leaky": 5}, guards).ranked_lists["leaky"]  # everything
    finally:
        guards.close()


def test_the_key_file_is_read_again_when_it_changes_and_refused_whole_while_broken(tmp_path, caplog):
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[principals.bob]\nkey_sha256 = "{key_hash("b")}"\nsources = ["docs"]\n')
    ring = KeyRing("single", AccessSettings(keys_file=str(keys)))
    assert ring.principal(b"single") is EVERYTHING and ring.principal(b"b").sources == frozenset({"docs"})
    keys.write_text(f'[principals.carol]\nkey_sha256 = "{key_hash("c")}"\nsources = ["*"]\ngroups = ["hr"]\n')
    assert ring.principal(b"b") is None and ring.principal(b"c").readers == frozenset({"carol", "hr"})
    keys.write_text('[principals.carol]\nkey_sha256 = "not-hex"\nsources = ["*"]\n')  # a typo: no key of it holds
    assert ring.principal(b"c") is None and ring.principal(b"single") is EVERYTHING
    assert "none of its keys is accepted" in caplog.text and "not-hex" not in caplog.text.split("key_sha256")[0]
    assert ring.principal(b"") is None and ring.principal(b"wrong") is None
    # principals whose keys' variables are unset still make keys required: never an open server
    unset = AccessSettings(principals={"dave": PrincipalSettings(sources=("*",), key_env="GRADFUSE_TEST_UNSET")})
    assert KeyRing(None, unset).required and KeyRing(None, AccessSettings()).required is False
    keys.write_text(f'[principals.dave]\nkey_sha256 = "{key_hash("d")}"\nsources = ["*"]\n')
    assert KeyRing(None, dataclasses.replace(unset, keys_file=str(keys))).principal(b"d") is None  # one name, two keys: the file is refused
    caplog.clear()
    assert KeyRing(None, AccessSettings(keys_file=str(tmp_path / "missing.toml"))).principal(b"d") is None
    assert "missing.toml cannot be read (No such file or directory)" in caplog.text  # logged at start, with why


@pytest.mark.skipif(not (Path(os.environ.get("GRADFUSE_DATA", "../shared/data")) / "beir_scifact").is_dir(),
                    reason="needs the shared data (GRADFUSE_DATA)")
def test_an_embedded_source_ranks_only_what_the_caller_may_read_so_k_come_back(tmp_path, monkeypatch):
    """600 SciFact passages, one in 40 for eng and the rest for hr, on the IVF index (the path of a large source):
    bob gets k passages he may read in every mode, the nearest of them (the scan widens where the lists it scans
    hold too few), and the BM25 index ranks among his only."""
    import numpy as np

    from gradfuse.sources import embedded
    from gradfuse.embedding.encoder import load_encoder

    data = Path(os.environ.get("GRADFUSE_DATA", "../shared/data")) / "beir_scifact"
    records = [json.loads(line) for line in (data / "corpus.jsonl").read_text().split("\n")[:600] if line.strip()]
    for n, record in enumerate(records):
        record["readers"] = ["eng"] if n % 40 == 0 else ["hr"]
        record["text"] = " ".join(record["text"].split()[:40])  # short passages embed fast; the index is tested
    write_jsonl(tmp_path / "c.jsonl", records)
    monkeypatch.setattr(embedded, "ANN_MIN_VECTORS", 500)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("sci", "jsonl", str(tmp_path / "c.jsonl")))
    bob, readable = frozenset({"bob", "eng"}), {r["id"] for r in records if r["readers"] == ["eng"]}
    queries = [json.loads(line)["text"] for line in (data / "queries.jsonl").read_text().split("\n")[:10]]
    with ws.holding("sci", "dense") as dense:
        assert dense._ann is not None
        rows = np.flatnonzero([r["readers"] == ["eng"] for r in records])
        for query in queries:
            found = [c.doc_id for c in dense.search(query, 10, readers=bob)]
            nearest = rows[np.argsort(-(dense._vectors[rows] @ load_encoder(ws.config.encoder).encode_query(query)),
                                      kind="stable")[:10]]
            assert found == [records[i]["id"] for i in nearest]  # the nearest readable ten, none other
            assert len(dense.search(query, 10)) == 10 and not set(c.doc_id for c in dense.search(query, 10)) <= readable
    for mode in ("bm25", "hybrid"):
        with ws.holding("sci", mode) as source:
            for query in queries:
                found = source.search(query, 10, readers=bob)
                assert {c.doc_id for c in found} <= readable and all(c.readers == ("eng",) for c in found)
                assert len(found) == 10 or mode == "bm25"  # BM25 finds only the passages sharing a word
            assert any(len(source.search(q, 10, readers=bob)) == 10 for q in queries)


def test_gradfuse_key_add_writes_a_key_the_server_accepts_and_shows_it_once_and_remove_revokes_it(tmp_path):
    import subprocess
    import sys

    (tmp_path / "gradfuse.toml").write_text('[access]\nkeys_file = "keys.toml"\n')  # where the key file is
    gradfuse = [str(Path(sys.executable).with_name("gradfuse")), "key"]
    add = [*gradfuse, "add", "bob", "--sources", "handbook,wiki", "--groups", "eng"]
    made = subprocess.run(add, capture_output=True, text=True, check=True, cwd=tmp_path)
    *said, key = made.stdout.strip().splitlines()
    assert f"principal bob in {tmp_path / 'keys.toml'}" in " ".join(said)
    assert "no source 'handbook', 'wiki' in this workspace yet" in " ".join(said)  # a typo shows
    assert key not in (tmp_path / "keys.toml").read_text()  # only its hash is kept
    ring = KeyRing(None, AccessSettings(keys_file=str(tmp_path / "keys.toml")))
    assert ring.principal(key.encode()) == Principal("bob", frozenset({"eng"}), frozenset({"handbook", "wiki"}))
    refused = subprocess.run([*gradfuse, "add", "bad name", *add[4:]], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and "principal name 'bad name'" in refused.stdout
    assert "bad name" not in (tmp_path / "keys.toml").read_text()
    removed = subprocess.run([*gradfuse, "remove", "bob"], capture_output=True, text=True, cwd=tmp_path)
    assert removed.returncode == 0 and ring.principal(key.encode()) is None  # read again: revoked
    again = subprocess.run([*gradfuse, "remove", "bob"], capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 2 and "has no principal 'bob'" in again.stdout


def test_a_files_pattern_that_matches_no_file_is_reported_and_one_from_the_root_refused(tmp_path):
    (tmp_path / "wiki" / "hr").mkdir(parents=True)
    (tmp_path / "wiki" / "hr" / "pay.md").write_text("# Pay\n\nSalaries are paid on the last working day.\n")
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    built = ws.index(SourceSpec("wiki", "files", str(tmp_path / "wiki"), {"readers": {"HR/*": ["hr"]}}))
    assert built.notes == ["readers pattern 'HR/*' matches no file: the files it was meant for are open to every "
                           "reader of the source"]
    (tmp_path / "wiki" / "public").mkdir()
    (tmp_path / "wiki" / "public" / "pay.md").symlink_to(tmp_path / "wiki" / "hr" / "pay.md")
    ws.index(SourceSpec("wiki", "files", str(tmp_path / "wiki"), {"readers": {"hr/*": ["hr"]}}))
    with ws.holding("wiki", "bm25") as wiki:  # read through a link, a file keeps the readers of where it is
        assert {c.parent_id: c.readers for c in wiki.search("salaries paid", 5)} == {"hr/pay.md": ("hr",),
                                                                                    "public/pay.md": ("hr",)}
    for pattern in ("/hr/*", "./hr/*"):  # refused as the spec is made: when the config is read
        with pytest.raises(ValueError, match=f"readers pattern '{re.escape(pattern)}'.*write 'hr/\\*'"):
            SourceSpec("wiki", "files", str(tmp_path / "wiki"), {"readers": {pattern: ["hr"]}})


def test_a_hard_link_across_readers_is_refused_and_reported(tmp_path):
    """Issue 58 L3: a hard link of hr/pay.md placed in public/ took public/'s readers: everyone read it."""
    (tmp_path / "wiki" / "hr").mkdir(parents=True)
    (tmp_path / "wiki" / "public").mkdir()
    (tmp_path / "wiki" / "hr" / "pay.md").write_text("# Pay\n\nSalaries are paid on the last working day.\n")
    (tmp_path / "wiki" / "public" / "office.md").write_text("# Office\n\nThe office opens at eight.\n")
    (tmp_path / "wiki" / "public" / "pay.md").hardlink_to(tmp_path / "wiki" / "hr" / "pay.md")
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    built = ws.index(SourceSpec("wiki", "files", str(tmp_path / "wiki"), {"readers": {"hr/*": ["hr"]}}))
    skipped = {file: (reason, detail) for file, reason, detail in built.skipped}
    assert skipped["public/pay.md"][0] == "hard link" and "hr/pay.md" in skipped["public/pay.md"][1]
    assert skipped["hr/pay.md"][0] == "hard link"
    with ws.holding("wiki", "bm25") as wiki:
        assert {c.parent_id for c in wiki.search("salaries paid office", 5)} == {"public/office.md"}


def test_a_corpus_whose_readers_field_means_something_else_is_told_how_to_read_none(tmp_path):
    from gradfuse.ingest.documents import IngestError

    write_jsonl(tmp_path / "reviews.jsonl", [{"id": "r1", "text": "A fine book.", "readers": 1200}])
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    with pytest.raises(IngestError, match='readers must be a list of names, not int.*readers_field = "" reads none'):
        ws.index(SourceSpec("reviews", "jsonl", str(tmp_path / "reviews.jsonl")))
    built = ws.index(SourceSpec("reviews", "jsonl", str(tmp_path / "reviews.jsonl"), {"readers_field": ""}))
    assert built.documents == 1 and ws.source("reviews", "bm25").search("book", 1)[0].readers == ()
