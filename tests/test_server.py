"""The HTTP service on a real server on loopback: results, faults, bad input, keys, load and the LM line."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from conftest import ASTRONOMY, COOKING, with_remote, write_jsonl
from live_server import Scraped, free_port, gradfuse_serve, serving
from test_generation import INJECTION

from gradfuse.access import EVERYTHING
from gradfuse.access.keys import AccessSettings, PrincipalSettings, key_hash
from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.rerank import PassTooLong
from gradfuse.server import API_KEY_ENV, ServerSettings, create_app
from gradfuse.sources.base import current_version


class Hanging:
    """A real source whose backend stops answering (until released, at most 60 s)."""

    def __init__(self, real, release: threading.Event):
        self.name, self._real, self._release = real.name, real, release

    def warm(self):
        self._real.warm()

    def search(self, query, k):
        self._release.wait(60)
        return self._real.search(query, k)

    def stats(self):
        return self._real.stats()


class Broken:
    """A real source whose backend refuses every query."""

    def __init__(self, real):
        self.name, self._real = real.name, real

    def warm(self):
        self._real.warm()

    def search(self, query, k):
        raise ConnectionError("search backend refused the connection")

    def stats(self):
        return self._real.stats()


RELEASE = threading.Event()  # lets the hanging source's calls return when the tests are done


def faulty_workspace(config: Config) -> Workspace:
    """A workspace whose source `slow` hangs and `broken` raises whenever they are queried (its catalog hands
    them out wrapped)."""
    ws = Workspace(config)
    real_holding = ws.catalog.holding

    @contextmanager
    def holding(name, retrieval=None):
        with real_holding(name, retrieval) as real:
            if name == "slow":
                yield Hanging(real, RELEASE)
            elif name == "broken":
                yield Broken(real)
            else:
                yield real

    ws.catalog.holding = holding
    return ws


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    root = tmp_path_factory.mktemp("faulty")
    ws = faulty_workspace(Config(workspace=root / "ws", timeout_s=1.0))
    ws.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(root / "a.jsonl", ASTRONOMY))))
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(root / "c.jsonl", COOKING))))
    ws.index(SourceSpec("slow", "jsonl", str(write_jsonl(root / "s.jsonl", ASTRONOMY[:1]))))
    ws.index(SourceSpec("broken", "jsonl", str(write_jsonl(root / "b.jsonl", COOKING[:1]))))
    yield ws
    RELEASE.set()


@pytest.fixture(scope="module")
def server(workspace):
    with serving(create_app(workspace, ServerSettings(max_k=20))) as url:
        yield url


NO_CACHE = ServerSettings(cache_mb=0)


def post(url: str, path: str, body, **kwargs) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120, **kwargs)


def test_search_returns_each_candidates_provenance_and_scores(server):
    found = post(server, "/search", {"query": "Phobos Deimos moons", "method": "rrf", "k": 3, "retrieval": "bm25"})
    assert found.status_code == 200, found.text
    result = found.json()
    top = result["candidates"][0]
    assert (top["source"], top["doc_id"], top["native_rank"]) == ("astronomy", "mars", 1)
    assert top["scores"]["fusion:rrf"] > 0 and top["native_score"] > 0
    assert [(m["source"], m["doc_id"]) for m in top["merged"]] == [("cooking", "mars-copy")]  # both provenances
    assert result["failures"] == [] and result["timings"]["retrieval"] > 0
    dense = post(server, "/search", {"query": "Phobos Deimos moons", "method": "dense", "k": 2}).json()
    assert "prior" in dense["candidates"][0]["scores"] and dense["candidates"][0]["doc_id"] == "mars"


@pytest.mark.slow
def test_the_default_method_is_select_and_a_question_no_source_answers_is_declined(server):
    options = httpx.get(server + "/options").json()
    assert options["defaults"]["method"] == "select" and options["defaults"]["scorer"] == "upr"
    assert options["reads"]["gro"]["upr"] == ["scorer", "n", "pool"] and options["reads"]["select"]["upr"] == []
    assert options["reads"]["gro"]["gradient"] == ["scorer", "n", "pool", "target", "estimator"]
    found = post(server, "/search", {"query": "Phobos Deimos moons", "k": 2}).json()
    assert found["method"] == "select" and found["selection"]["chosen"][0]["source"] == "astronomy"
    answered = post(server, "/ask", {"query": "Which planet has the moons Phobos and Deimos?", "k": 2,
                                     "max_new_tokens": 8}).json()
    assert answered["method"] == "select" and not answered["abstained"] and answered["support"] > 0.5
    assert answered["generator"] == "smollm2"  # this workspace has its generator write
    missing = post(server, "/ask", {"query": "What is the default TCP port of a PostgreSQL server?", "k": 2}).json()
    assert missing["abstained"] and missing["support"] < 0.1 and missing["answer"].startswith("Not found in these")
    assert missing["generator"] == "extractive" and missing["citations"]  # nothing written; the closest, cited


def test_sources_health_and_the_openapi_schema(server):
    sources = httpx.get(server + "/sources").json()
    assert {s["input"] for s in sources} == {"astronomy", "cooking.jsonl"}  # names, not the server's paths
    assert {(s["name"], s["status"], s["documents"]) for s in sources} == {("astronomy", "ok", 3), ("cooking", "ok", 3)}
    assert all(s["encoder"] == "all-MiniLM-L6-v2@float32" and s["built_at"] for s in sources)
    assert httpx.get(server + "/healthz").json()["sources"] == 2
    schema = httpx.get(server + "/openapi.json").json()
    assert {"/search", "/ask", "/sources", "/healthz"} <= set(schema["paths"])
    docs = httpx.get(server + "/docs").text
    assert "/static-offline-docs/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()


def test_failed_sources_are_named_and_the_others_answer_within_the_timeout(faulty):
    with serving(create_app(faulty)) as url:
        started = time.perf_counter()
        found = post(url, "/search", {"query": "planet moons", "method": "rrf", "timeout_s": 1.0})
        elapsed = time.perf_counter() - started
        assert found.status_code == 200, found.text
        failures = {f["source"]: f for f in found.json()["failures"]}
        assert failures["slow"]["reason"] == "timeout" and "1 s" in failures["slow"]["detail"]
        assert failures["broken"]["reason"] == "error" and "refused the connection" in failures["broken"]["detail"]
        assert {c["source"] for c in found.json()["candidates"]} <= {"astronomy", "cooking"}
        assert elapsed < 30  # it did not wait for the hanging source (60 s)
        health = {s["name"]: s for s in httpx.get(url + "/sources").json()}
        assert health["broken"]["last_failure"].startswith("error: ConnectionError")
        assert health["slow"]["last_failure"].startswith("timeout") and health["astronomy"]["last_failure"] is None
        assert health["astronomy"]["last_answered_at"]

        down = post(url, "/search", {"query": "planet moons", "sources": ["slow", "broken"], "timeout_s": 1.0})
        assert down.status_code == 503
        assert "every source failed" in down.json()["detail"]
        assert {f["source"] for f in down.json()["failures"]} == {"slow", "broken"}


def test_a_key_limited_to_some_documents_is_told_why_a_source_failed_not_what_it_said(faulty):
    """The failure came of another caller's request, and an engine's error may quote that caller's query."""
    bob = PrincipalSettings(sources=("*",), groups=("eng",), key_sha256=key_hash(b"bob-key"))
    plain = faulty.config
    faulty.config = replace(plain, access=AccessSettings(principals={"bob": bob}))
    try:
        with serving(create_app(faulty, ServerSettings(api_key="admin-key"))) as url:
            asked = httpx.post(url + "/search", json={"query": "planet moons", "method": "rrf",
                                                      "sources": ["astronomy", "broken"]},
                               headers={"X-API-Key": "admin-key"}, timeout=60)
            assert asked.status_code == 200 and asked.json()["failures"][0]["source"] == "broken"
            seen = {key: {s["name"]: s for s in httpx.get(url + "/sources", headers={"X-API-Key": key}).json()}
                    for key in ("bob-key", "admin-key")}
            assert seen["bob-key"]["broken"]["last_failure"] == "error"
            assert "refused the connection" in seen["admin-key"]["broken"]["last_failure"]
    finally:
        faulty.config = plain


BAD_REQUESTS = [
    # (body as sent, content type, status, words the message must contain)
    (b'{"query": "moons"', "application/json", 400, "malformed JSON"),
    (b'{"query": 5}', "application/json", 422, "query: Input should be a valid string"),
    (b'{"query": "moons", "k": "3"}', "application/json", 422, "k: Input should be a valid integer"),
    (b'{"query": ""}', "application/json", 422, "at least 1 character"),
    (b'{"query": "   "}', "application/json", 422, "query is empty"),
    (b'{"query": "moons \\ud800"}', "application/json", 422, "query: not valid Unicode text (a lone surrogate"),
    (json.dumps({"query": "a" * 9000}).encode(), "application/json", 422, "at most 8000"),
    (b'{"query": "moons", "k": 1000000}', "application/json", 422, "limit of 20"),
    (b'{"query": "moons", "n": 1000}', "application/json", 422, "n = 1000 is above"),
    (b'{"query": "moons", "method": "magic"}', "application/json", 422, "method: unknown method (choose"),
    (b'{"query": "moons", "method": "single:nowhere"}', "application/json", 422, "single:<source> names no source"),
    (b'{"query": "moons", "sources": ["nowhere"]}', "application/json", 422, "sources: unknown source (available"),
    (b'{"query": "moons", "sources": ["no/where"]}', "application/json", 422, "invalid source name: use 1 to 64"),
    (b'{"query": "moons", "target": "vibes"}', "application/json", 422, "target: Input should be"),
    (b'{"query": "moons", "sorce": ["astronomy"]}', "application/json", 422, "sorce: Extra inputs"),
    (b'{"query": "moons", "method": "gro", "scorer": "gradient", "target": "gold"}', "application/json", 422,
     "needs a reference answer (gold)"),
    (b"query=moons", "application/x-www-form-urlencoded", 415, "application/json"),
    (json.dumps({"query": "x" * 70_000}).encode(), "application/json", 413, "limit of 65536 bytes"),
]


@pytest.mark.parametrize("body, kind, status, words", BAD_REQUESTS)
def test_bad_input_is_a_specific_4xx_and_the_server_keeps_serving(server, body, kind, status, words):
    answer = httpx.post(server + "/search", content=body, headers={"Content-Type": kind}, timeout=60)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["detail"]
    assert post(server, "/search", {"query": "moons", "method": "rrf"}).status_code == 200


def test_a_body_without_a_content_type_is_refused(server):
    """A cross-site page can send a typeless body without a preflight: it must not start any work."""
    answer = httpx.post(server + "/search", content=b'{"query": "moons", "method": "rrf"}', timeout=30)
    assert answer.status_code == 415 and "application/json" in answer.json()["detail"]


def test_an_oversized_body_without_a_length_header_is_refused_while_it_streams(server):
    chunks = (b'{"query": "' + b"x" * 8192 for _ in range(10))
    answer = httpx.post(server + "/search", content=chunks, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413 and "above this server's limit" in answer.json()["detail"]


def test_an_api_key_is_required_when_one_is_configured(workspace, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "s3cret-key")
    with serving(create_app(workspace)) as url:
        body = {"query": "moons", "method": "rrf"}
        missing = post(url, "/search", body)
        assert missing.status_code == 401 and "X-API-Key" in missing.json()["detail"]
        assert post(url, "/search", body, headers={"X-API-Key": "wrong"}).status_code == 401
        assert httpx.get(url + "/sources").status_code == 401
        assert post(url, "/search", body, headers={"X-API-Key": "s3cret-key"}).status_code == 200
        assert httpx.get(url + "/healthz").status_code == 200  # probes need no key
        assert httpx.get(url + "/options").status_code == 401
        options = httpx.get(url + "/options", headers={"X-API-Key": "s3cret-key"})
        assert options.json()["api_key_required"] is True
        # The key is checked before the body is read: a malformed body without it learns nothing.
        malformed = httpx.post(url + "/search", content=b"{not json", headers={"Content-Type": "application/json"})
        assert malformed.status_code == 401
        assert httpx.get(url + "/").status_code == 200 and httpx.get(url + "/docs").status_code == 200


def test_metrics_need_the_key_and_show_each_sources_latency_breaker_the_lm_line_and_the_cache(workspace, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "s3cret-key")
    key = {"X-API-Key": "s3cret-key"}
    with serving(create_app(workspace)) as url:
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers={"X-API-Key": "wrong"}).status_code == 401
        body = {"query": "Phobos Deimos moons", "method": "rrf", "retrieval": "bm25"}
        for _ in range(2):  # the second is answered from the cache: no source is asked
            assert post(url, "/search", body, headers=key).status_code == 200
        metric = Scraped(url, **key)
    assert metric.families["gradfuse_source_search_seconds"].type == "histogram"
    for source in ("astronomy", "cooking"):
        assert metric("gradfuse_source_search_seconds_count", source=source) == 1
        assert metric("gradfuse_source_search_seconds_sum", source=source) > 0
        assert metric("gradfuse_source_breaker_state", source=source) == 0  # closed
    assert metric("gradfuse_result_cache_misses_total") == 1 and metric("gradfuse_result_cache_hits_total") == 1
    assert metric("gradfuse_lm_queue_depth") == 0 and metric("gradfuse_lm_queue_limit") == 8
    assert not metric.families["gradfuse_source_failures"].samples
    assert "Phobos" not in metric.text  # a query is never a label


def test_metrics_count_a_failing_sources_calls_by_reason_even_when_every_source_failed(tmp_path):
    ws = with_remote(tmp_path, f"http://127.0.0.1:{free_port()}", guard="breaker_failures = 1")  # nothing listens
    with serving(create_app(ws)) as url:
        alone = post(url, "/search", {"query": "bread yeast", "method": "rrf", "sources": ["team"]})
        assert alone.status_code == 503  # every source failed: a 503, and its failure still counted
        both = post(url, "/search", {"query": "bread yeast", "method": "rrf"})
        assert both.status_code == 200 and [f["reason"] for f in both.json()["failures"]] == ["open"]
        metric = Scraped(url)
    assert metric("gradfuse_source_failures_total", source="team", reason="error") == 1
    assert metric("gradfuse_source_failures_total", source="team", reason="open") == 1
    assert metric("gradfuse_source_breaker_state", source="team") == 2  # open
    assert metric("gradfuse_source_search_seconds_count", source="cooking") == 1
    assert metric("gradfuse_source_search_seconds_count", source="team") is None  # only answers have a latency


def test_no_redirect_is_built_from_the_host_header_and_unknown_hosts_are_refused_without_a_key(server):
    answer = httpx.post(server + "/search/", json={"query": "moons"}, headers={"Host": "evil.example"})
    assert answer.status_code in (400, 404) and "location" not in answer.headers
    assert httpx.post(server + "/search/", json={"query": "moons"}).status_code == 404  # no slash redirect
    rebound = httpx.get(server + "/sources", headers={"Host": "evil.example"})  # a DNS-rebinding page's request
    assert rebound.status_code == 400
    assert httpx.get(server + "/sources", headers={"Host": "localhost"}).status_code == 200


def test_cors_is_off_unless_origins_are_configured(workspace):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    with serving(create_app(workspace)) as url:
        answer = httpx.options(url + "/search", headers=preflight)
        assert "access-control-allow-origin" not in answer.headers
    settings = replace(workspace.config.server, cors_origins=("http://app.example",))
    with serving(create_app(workspace, settings)) as url:
        answer = httpx.options(url + "/search", headers=preflight)
        assert answer.headers["access-control-allow-origin"] == "http://app.example"


def test_fifty_concurrent_searches_all_succeed(server):
    queries = ["planet moons", "bread yeast", "hottest planet surface", "risotto stock", "gas giant"] * 10

    def one(query: str) -> int:
        return post(server, "/search", {"query": query, "method": "rrf", "k": 5}).status_code

    with ThreadPoolExecutor(max_workers=50) as pool:
        statuses = list(pool.map(one, queries))
    assert statuses == [200] * 50


def test_a_rebuilt_source_is_served_without_a_restart(tmp_path):
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    corpus = write_jsonl(tmp_path / "notes.jsonl", ASTRONOMY[:1])
    ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    with serving(create_app(ws)) as url:
        body = {"query": "bread yeast", "method": "rrf", "retrieval": "bm25"}
        for mode in ("bm25", "dense", "hybrid"):  # every mode opens the first version
            post(url, "/search", {**body, "retrieval": mode})
        write_jsonl(corpus, ASTRONOMY[:1] + COOKING[:1])
        ws.index(SourceSpec("notes", "jsonl", str(corpus)))
        assert post(url, "/search", body).json()["candidates"][0]["doc_id"] == "bread"
        gc.collect()
        # The first version's files were deleted when the second was published; none is still held open.
        assert [f for f in _open_files() if str(ws.root) in f and "(deleted)" in f] == []


def test_a_repeated_question_is_answered_from_the_cache_until_a_source_is_published(tmp_path):
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    corpus = write_jsonl(tmp_path / "notes.jsonl", ASTRONOMY)
    ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    ws.index(SourceSpec("kitchen", "jsonl", str(write_jsonl(tmp_path / "kitchen.jsonl", COOKING[:2]))))
    search = {"query": "How long does bread dough rise with yeast?", "method": "rrf", "retrieval": "bm25"}
    ask = {**search, "k": 2}
    with serving(create_app(ws)) as url:
        first, again = post(url, "/search", search), post(url, "/search", search)
        assert "x-gradfuse-cache" not in first.headers and again.headers["x-gradfuse-cache"] == "hit"
        assert again.json() == first.json()
        assert "x-gradfuse-cache" not in post(url, "/search", {**search, "k": 3}).headers  # other settings
        answered, repeated = post(url, "/ask", ask), post(url, "/ask", ask)
        assert repeated.headers["x-gradfuse-cache"] == "hit" and repeated.json() == answered.json()
        with httpx.stream("POST", url + "/ask", json={**ask, "stream": True}, timeout=120) as streamed:
            assert streamed.headers["x-gradfuse-cache"] == "hit"
            events = [block.split("\n") for block in streamed.read().decode().strip().split("\n\n")]
        assert [e[0] for e in events] == ["event: search", "event: token", "event: answer"]
        assert json.loads(events[-1][1].removeprefix("data: ")) == answered.json()

        write_jsonl(corpus, ASTRONOMY + [{"id": "sourdough", "title": "Sourdough",
                                          "text": "Bread dough with yeast rises for about two hours."}])
        ws.index(SourceSpec("notes", "jsonl", str(corpus)))  # a publish: what was kept is stale
        fresh = post(url, "/search", search)
        assert "x-gradfuse-cache" not in fresh.headers
        assert "sourdough" in [c["doc_id"] for c in fresh.json()["candidates"]]
        assert "x-gradfuse-cache" not in post(url, "/ask", ask).headers


def test_the_cache_keeps_at_most_its_megabytes_dropping_the_least_recently_used(workspace):
    from gradfuse.server.cache import ResultCache
    from gradfuse.server.requests import SearchRequest

    cache = ResultCache(workspace, 1)
    keys = [cache.key("search", SearchRequest(query=f"question {i}"), EVERYTHING) for i in range(3)]
    cache.put(keys[0], ("a" * 400_000,), failed=False)
    cache.put(keys[1], ("b" * 400_000,), failed=False)
    assert cache.get(keys[0])  # now the most recently used
    cache.put(keys[2], ("c" * 400_000,), failed=False)  # 1.2 MB: one must go
    assert cache.get(keys[1]) is None and cache.get(keys[0]) and cache.get(keys[2])
    cache.put(keys[1], ("d" * 2_000_000,), failed=False)  # larger than the whole cache: not kept
    assert cache.get(keys[1]) is None and cache.get(keys[2])
    assert ResultCache(workspace, 0).key("search", SearchRequest(query="q"), EVERYTHING) is None  # 0: off
    # Issue 58 L5: counted in bytes: 300,000 astral characters are 1.2 MB, more than the whole cache
    astral = cache.key("search", SearchRequest(query="astral"), EVERYTHING)
    cache.put(astral, ("\U0001F600" * 300_000,), failed=False)
    assert cache.get(astral) is None


def test_a_result_where_a_source_failed_is_not_kept(faulty):
    with serving(create_app(faulty)) as url:
        body = {"query": "bread yeast", "method": "rrf", "sources": ["cooking", "broken"]}
        for _ in range(2):
            found = post(url, "/search", body)
            assert found.status_code == 200 and found.json()["failures"]
            assert "x-gradfuse-cache" not in found.headers  # the next request asks the sources again


def _open_files() -> list[str]:
    fds = Path("/proc/self/fd")
    return [os.readlink(fd) for fd in fds.iterdir() if fd.is_symlink() and os.path.exists(fd)]


def test_gradfuse_serve_starts_from_the_command_line(workspace):
    with gradfuse_serve(workspace.root, env={API_KEY_ENV: ""}) as url:
        found = post(url, "/search", {"query": "Phobos", "method": "rrf", "retrieval": "bm25"})
        assert found.status_code == 200 and found.json()["candidates"][0]["doc_id"] == "mars"
        page = httpx.get(url + "/")
        assert page.status_code == 200 and "/static/app.js" in page.text
        assert "http" not in page.text.split("<body>")[0].replace("http-equiv", "")  # nothing loaded from outside


@pytest.mark.slow
def test_ask_streams_search_then_tokens_then_the_answer(workspace):
    body = {"query": "Which planet has the moons Phobos and Deimos?", "method": "gro", "k": 3, "n": 4,
            "max_new_tokens": 24, "target": "query", "scorer": "gradient"}
    with serving(create_app(workspace, NO_CACHE)) as url:  # the streamed answer is generated, not replayed
        plain = post(url, "/ask", body).json()
        with httpx.stream("POST", url + "/ask", json={**body, "stream": True}, timeout=120) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [(block.split("\n")[0].removeprefix("event: "),
                       json.loads(block.split("\n")[1].removeprefix("data: ")))
                      for block in response.read().decode().strip().split("\n\n")]
    names = [name for name, _ in events]
    assert names[0] == "search" and names[-1] == "answer" and set(names[1:-1]) == {"token"}
    search, answer = events[0][1], events[-1][1]
    assert search["selection"]["chosen"] and "rerank:reader_gate" in search["candidates"][0]["scores"]
    assert search["rerank"]["score_key"] == "rerank:reader_gate" and search["rerank"]["scorer"] == "gradient"
    # The tokens as the model wrote them; the answer event's text with its citations corrected.
    assert "".join(data["text"] for name, data in events if name == "token").strip() == answer["written"]
    assert answer["statements"] and answer["answer"] == " ".join(s["text"] for s in answer["statements"])
    assert answer["answer"] == plain["answer"]  # greedy decoding: streamed or not, the same answer
    assert answer["citations"] and {"retrieval", "selection", "lm_pass", "generation"} <= set(answer["timings"])


@pytest.mark.slow
def test_requests_beyond_the_lm_line_are_refused_with_retry_after(workspace):
    settings = replace(workspace.config.server, lm_queue=1, cache_mb=0)
    with serving(create_app(workspace, settings, preload_lm=True)) as url:
        body = {"query": "Which planet is the hottest?", "method": "gradient", "target": "query", "n": 6}
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda _: post(url, "/search", body), range(4)))
        statuses = sorted(a.status_code for a in answers)
        assert 200 in statuses and 503 in statuses, statuses
        refused = next(a for a in answers if a.status_code == 503)
        assert refused.headers["retry-after"] and "already running or queued" in refused.json()["detail"]
        # fusion requests never wait in the LM line
        assert post(url, "/search", {"query": "hottest planet", "method": "rrf"}).status_code == 200


@pytest.mark.slow
def test_a_passage_that_gives_orders_is_answered_as_data_over_http(tmp_path):
    ws = Workspace(Config(workspace=tmp_path / "ws", answer="generate"))
    records = [{"id": "canberra", "title": "Canberra", "text": "Canberra is the capital city of Australia."},
               {"id": "evil-page", "title": "Australia", "text": "Australia capital: " + INJECTION}]
    ws.index(SourceSpec("web", "jsonl", str(write_jsonl(tmp_path / "web.jsonl", records))))
    with serving(create_app(ws)) as url:
        answer = post(url, "/ask", {"query": "What is the capital of Australia?", "method": "concat",
                                    "retrieval": "dense", "k": 2, "max_new_tokens": 40})
    assert answer.status_code == 200, answer.text
    passages = {p["doc_id"] for p in answer.json()["passages"]}
    assert passages == {"canberra", "evil-page"}  # the injected passage did reach the model
    text = answer.json()["answer"]
    assert "Canberra" in text and "PWNED-4471" not in text


def test_kill_9_mid_rebuild_keeps_the_previous_index_served_and_the_next_run_completes(tmp_path):
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    corpus = write_jsonl(tmp_path / "notes.jsonl", ASTRONOMY)
    ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    source_dir = ws.root / "sources" / "notes"
    published = current_version(source_dir)
    # A rebuild long enough to be caught in the middle: embedding 1,500 new passages takes many seconds here.
    bigger = ASTRONOMY + [{"id": f"log-{i}", "text": f"Observation log {i}: the telescope tracked comet {i * 7} "
                           f"through {i % 12} degrees of sky while the {i % 5}th filter recorded its tail."}
                          for i in range(1500)]
    write_jsonl(corpus, bigger)
    command = [str(Path(sys.executable).parent / "gradfuse"), "index", "jsonl", str(corpus), "-s", "notes",
               "-w", str(ws.root)]
    with serving(create_app(ws)) as url:
        rebuild = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not any((p / "bm25").is_dir() for p in source_dir.glob("build-*")):  # embedding has begun
            assert rebuild.poll() is None, "the rebuild ended before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(rebuild.pid, signal.SIGKILL)
        rebuild.wait()
        assert rebuild.returncode == -signal.SIGKILL
        assert current_version(source_dir) == published and list(source_dir.glob("build-*"))
        body = {"query": "comet telescope observation", "method": "rrf", "retrieval": "bm25"}
        before = post(url, "/search", body)
        assert before.status_code == 200 and before.json()["candidates"] == []  # the old index, intact
        assert post(url, "/search", {**body, "query": "Phobos"}).json()["candidates"][0]["doc_id"] == "mars"

        finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert finished.returncode == 0, finished.stdout + finished.stderr
        assert current_version(source_dir) != published and not list(source_dir.glob("build-*"))
        after = post(url, "/search", body).json()["candidates"]
        assert after and after[0]["doc_id"].startswith("log-")  # served from the new version, no restart


def test_a_request_that_would_cost_too_many_lm_passes_is_refused_naming_the_limit(server):
    answer = post(server, "/search", {"query": "moons", "method": "loo-greedy", "n": 50, "k": 20})
    assert answer.status_code == 422
    assert "max_lm_passes" in answer.json()["detail"] and "LM passes" in answer.json()["detail"]
    assert post(server, "/search", {"query": "moons", "method": "rrf", "k": 5}).status_code == 200


def test_lm_passes_count_the_upr_prior_and_the_evidence(workspace):
    """A UPR prior adds n passes to another signal; an answer's LM-scored evidence adds its own (bounded by
    [evidence] max_lm_passes): both count against the server's max_lm_passes, and the refusal says so."""
    from dataclasses import replace

    from gradfuse.reading.scoring import EvidenceSettings

    config = replace(workspace.config, rerank=replace(workspace.config.rerank, prior="upr"),
                     evidence=EvidenceSettings(scorer="upr", max_lm_passes=20), answer="extractive")
    ws = Workspace(config)
    with serving(create_app(ws, ServerSettings(max_lm_passes=16, cache_mb=0))) as url:
        priced = post(url, "/search", {"query": "moons", "method": "gro", "scorer": "gradient", "n": 20})
        assert priced.status_code == 422 and "costs 21 LM passes" in priced.json()["detail"]
        assert post(url, "/search", {"query": "moons", "method": "gro", "scorer": "gradient", "n": 5}).status_code \
            == 200
        asked = post(url, "/ask", {"query": "moons", "method": "rrf", "k": 100})
        assert asked.status_code == 422
        assert "costs 20 LM passes (20 of them quoting the evidence" in asked.json()["detail"]
        assert post(url, "/search", {"query": "moons", "method": "rrf", "k": 100}).status_code == 200


def test_the_page_forbids_framing_sniffing_and_scripts_from_elsewhere(server):
    page = httpx.get(server + "/", timeout=30)
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy and "script-src" not in policy
    assert httpx.get(server + "/static/app.js", timeout=30).headers["content-security-policy"] == policy
    api = post(server, "/search", {"query": "moons", "method": "rrf"})
    for response in (page, api):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"


def test_lm_evidence_reads_the_first_sentences_its_passes_allow():
    from gradfuse.rerank.sentences import Passage, within_passes

    passages = [Passage("", "a. b. c.", [(0, 2), (3, 5), (6, 8)]), Passage("", "d. e. f.", [(0, 2), (3, 5), (6, 8)])]
    assert [len(p.sentences) for p in within_passes("upr", passages, 5)] == [3, 2]
    assert [len(p.sentences) for p in within_passes("loo", passages, 5)] == [3, 1]
    assert within_passes("gate", passages, 1) == passages


@pytest.mark.slow
def test_an_answer_stops_generating_when_its_client_leaves(workspace, monkeypatch):
    from gradfuse.generate import make_generator

    engine = make_generator("smollm2").llamacpp
    decoded = []
    real_complete = engine.complete

    def counting(prompt, *, on_piece=None, **options):  # the real engine, its pieces counted
        decoded.clear()
        count = (lambda piece: decoded.append(piece) or (on_piece(piece) if on_piece else False))
        return real_complete(prompt, on_piece=count, **options)

    monkeypatch.setattr(engine, "complete", counting)
    # A question its passages support well: a weakly supported one is declined before any token is decoded.
    body = {"query": "Describe the planets Mars, Jupiter and Venus: their moons, the Great Red Spot, the carbon "
                     "dioxide atmosphere and the hottest surface.", "method": "rrf", "k": 3,
            "max_new_tokens": 200}
    with serving(create_app(workspace, NO_CACHE)) as url:  # the same question is generated again each time
        answered = post(url, "/ask", body)
        assert answered.status_code == 200 and not answered.json()["abstained"], answered.text[:300]
        full = len(decoded)
        assert full > 60, full  # long enough for an early stop to show
        with httpx.stream("POST", url + "/ask", json={**body, "stream": True}, timeout=120) as response:
            for line in response.iter_lines():
                if line == "event: token":
                    break  # the client leaves after its first token
        assert engine._lock.acquire(timeout=60)  # the engine is free again...
        engine._lock.release()
        assert len(decoded) < full / 2, (len(decoded), full)  # ...long before a full answer was decoded
        assert post(url, "/ask", {**body, "max_new_tokens": 8}).status_code == 200

        decoded.clear()
        with pytest.raises(httpx.ReadTimeout):  # a plain /ask whose client gives up while it is generated
            httpx.post(url + "/ask", json=body, timeout=httpx.Timeout(120, read=0.6))
        time.sleep(0.5)
        assert engine._lock.acquire(timeout=60)
        engine._lock.release()
        assert len(decoded) < full * 0.8, (len(decoded), full)
        assert post(url, "/ask", {**body, "max_new_tokens": 8}).status_code == 200


def test_stage2_passes_are_bounded_in_tokens_and_gold_in_characters(server, workspace):
    limits = httpx.get(server + "/options").json()["limits"]
    assert limits["max_pass_tokens"] == workspace.config.rerank.max_pass_tokens and limits["max_gold_chars"] > 0
    long_query = "Which planet has these moons: " + " ".join(str(i) for i in range(1400))  # 6,000 characters
    refused = post(server, "/search", {"query": long_query, "method": "gro", "scorer": "gradient", "target": "query"})
    assert refused.status_code == 422 and "max_pass_tokens" in refused.json()["detail"], refused.text[:300]
    assert "tokens" in refused.json()["detail"]
    pointwise = post(server, "/search", {"query": long_query[:1500], "method": "upr", "n": 3})
    assert pointwise.status_code == 200, pointwise.text[:300]  # one passage a pass: fits UPR, not the packed pool
    packed = post(server, "/search", {"query": long_query[:1500], "method": "gradient", "n": 3, "target": "gold",
                                      "gold": long_query[:1000]})  # question and gold in one packed pass
    assert packed.status_code == 422 and "max_pass_tokens" in packed.json()["detail"]
    gold = post(server, "/search", {"query": "moons", "method": "gro", "scorer": "gradient", "target": "gold",
                                    "gold": "Phobos " * 500})
    assert gold.status_code == 422 and "max_gold_chars" in gold.json()["detail"]
    with pytest.raises(PassTooLong, match="max_pass_tokens"):
        workspace.search(long_query, method="gradient", target="query")


def test_a_read_only_workspace_is_the_servers_503_and_healthz_says_so(tmp_path):
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(tmp_path / "a.jsonl", ASTRONOMY))))
    frozen = tmp_path / "read-only"
    frozen.mkdir()
    bind = subprocess.run(["mount", "--bind", str(ws.root), str(frozen)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bind.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(frozen)], check=True)
        with serving(create_app(Workspace(Config(workspace=frozen)))) as url:
            searched = post(url, "/search", {"query": "moons", "method": "rrf"})
            assert searched.status_code == 503 and "read-only" in searched.json()["detail"], searched.text
            health = httpx.get(url + "/healthz", timeout=30)
            assert health.status_code == 503 and "read-only" in health.json()["detail"]
        with serving(create_app(ws)) as url:  # the same index, writable: ready
            assert httpx.get(url + "/healthz", timeout=30).json()["status"] == "ok"
    finally:
        subprocess.run(["umount", "--lazy", str(frozen)], check=True)


def test_an_empty_key_is_no_key_and_keeps_the_host_check(workspace, monkeypatch):
    """`api_key = ""` once installed a key check that an absent header passed, and dropped the Host check."""
    from gradfuse.server import API_KEY_ENV
    from gradfuse.server.app import create_app

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    settings = replace(workspace.config.server, api_key="")
    assert settings.resolved_api_key() is None
    with serving(create_app(workspace, settings)) as url:
        rebound = httpx.post(url + "/search", json={"query": "moons", "method": "rrf"},
                             headers={"Host": "attacker.example"}, timeout=30)
        assert rebound.status_code == 400  # a page on another name cannot reach it
        assert httpx.post(url + "/search", json={"query": "moons", "method": "rrf"}, timeout=30).status_code == 200


def test_one_key_holds_at_most_half_of_the_lm_line():
    """Issue 58 L6: one key sending 8 LM requests took the whole line, and every other key's got 503."""
    from gradfuse.access import Principal
    from gradfuse.server.admission import Busy, LMAdmission

    admission = LMAdmission(8)
    bob, alice = Principal("bob"), Principal("alice")
    held = [admission.place(True, bob) for _ in range(4)]
    with pytest.raises(Busy, match="this key holds 4 places"):
        admission.place(True, bob)
    alices = [admission.place(True, alice) for _ in range(4)]  # the other half is alice's to take
    with pytest.raises(Busy, match="8 language-model requests are already running"):
        admission.place(True, Principal("carol"))
    held[0]()
    held[0]()  # given back once, however often it is called
    admission.place(True, bob)
    for give_back in alices:
        give_back()
    assert admission.active == 4
