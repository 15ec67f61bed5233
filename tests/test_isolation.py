"""Each source fails alone (hardening round 5, H1, M2, M3, L1): a hung or trickling engine keeps only its own
workers, a breaker stops calling a source that keeps failing, and a remote's reply is bounded in time, size and
shape. The faults are real: a `gradfuse serve` paused with SIGSTOP, and a loopback server that trickles or sends
too much or malformed JSON, as a broken node would."""

from __future__ import annotations

import gzip
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conftest import ASTRONOMY, COOKING, with_remote, write_jsonl
from live_server import gradfuse_serve, serving

from gradfuse import SourceSpec, Workspace
from gradfuse.config import ConfigError, load_config
from gradfuse.server import create_app
from gradfuse.sources.base import SourceError
from gradfuse.federation.federated import AllSourcesFailed


@pytest.fixture(scope="module")
def paused_remote(tmp_path_factory):
    """A second gradfuse server (astronomy) and its process, to pause."""
    root = tmp_path_factory.mktemp("remote")
    Workspace(load_config(workspace=root / "ws")).index(
        SourceSpec("astronomy", "jsonl", str(write_jsonl(root / "a.jsonl", ASTRONOMY))))
    processes = []
    with gradfuse_serve(root / "ws", processes=processes) as url:
        yield url, processes[0]


def _wait_until(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        time.sleep(0.05)


def test_a_paused_remote_holds_only_its_own_workers_and_the_other_sources_keep_answering(paused_remote, tmp_path):
    """The round-5 repro: with one engine hung, 36 requests naming it and a healthy source; before, they took the
    shared pool's threads and even requests naming only the healthy source got 503."""
    url, process = paused_remote
    ws = with_remote(tmp_path, url, guard="workers = 2\nbreaker_failures = 0", timeout_s=1)
    assert not ws.search("Which planet has two moons?", method="rrf", k=3).failures  # both answer
    process.send_signal(signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(12) as clients:
            both = list(clients.map(lambda _: ws.search("pasta", method="rrf", k=3), range(36)))
        reasons = [f.reason for r in both for f in r.failures]
        assert all(r.candidates and {c.source for c in r.candidates} == {"cooking"} for r in both)
        assert set(reasons) <= {"timeout", "busy"} and "busy" in reasons and len(reasons) == 36
        assert ws.guards["team"].late <= 2  # never more than its two workers (a late call may have ended by its deadline)
        busy = next(f for r in both for f in r.failures if f.reason == "busy")
        assert "all 2 of its workers are still held" in busy.detail
        with serving(create_app(ws)) as served:  # the server's paths for the healthy source alone
            for _ in range(8):
                alone = httpx.post(served + "/search", json={"query": "bread yeast", "sources": ["cooking"]},
                                   timeout=30)
                assert alone.status_code == 200 and alone.json()["candidates"][0]["doc_id"] == "bread"
            sources = {r["name"]: r for r in httpx.get(served + "/sources", timeout=30).json()}
            assert sources["cooking"]["status"] == "ok" and sources["team"]["status"] == "error"
    finally:
        process.send_signal(signal.SIGCONT)
    _wait_until(lambda: ws.guards["team"].late == 0)  # the late calls returned: their workers are free again
    assert not ws.search("Which planet has two moons?", method="rrf", k=3).failures


def test_a_source_that_keeps_failing_is_not_called_until_its_breaker_lets_one_probe_through(paused_remote, tmp_path):
    url, process = paused_remote
    ws = with_remote(tmp_path, url, guard="breaker_failures = 2\nbreaker_cooldown_s = 1.5", timeout_s=1)
    process.send_signal(signal.SIGSTOP)
    try:
        first = [ws.search("pasta", method="rrf", k=3).failures[0].reason for _ in range(2)]
        assert first == ["timeout", "timeout"] and ws.guards.state("team") == "open"
        skipped = ws.search("pasta", method="rrf", k=3)
        assert skipped.failures[0].reason == "open" and "circuit breaker is open after 2 failures" in \
            skipped.failures[0].detail and skipped.candidates
        assert ws.guards["team"].breaker.failures == 2  # not called: a call would have timed out, a third failure
        with serving(create_app(ws)) as served:
            health = httpx.get(served + "/healthz", timeout=30).json()
            assert health["status"] == "degraded" and health["breakers"] == {"team": "open"}
            team = next(r for r in httpx.get(served + "/sources", timeout=30).json() if r["name"] == "team")
            assert team["breaker"] == "open" and "circuit breaker" in team["error"]
        _wait_until(lambda: ws.guards.state("team") == "half-open")
        probe = ws.search("pasta", method="rrf", k=3)  # the probe fails: open again, for a whole cool-down
        assert probe.failures[0].reason == "timeout" and ws.guards.state("team") == "open"
    finally:
        process.send_signal(signal.SIGCONT)
    _wait_until(lambda: ws.guards.state("team") == "half-open")
    recovered = ws.search("Which planet has two moons?", method="rrf", k=3)  # the probe answers: closed
    assert not recovered.failures and ws.guards.state("team") == "closed"


class _BrokenNode(BaseHTTPRequestHandler):
    """A node that answers /search badly, as `mode` says: trickle (a byte every 0.2 s), huge (3 MB, with or without
    Content-Length), one malformed row (`row`), or slow (well, in 1.5 s)."""

    mode, row = "trickle", {}

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        good = {"source": "far", "doc_id": "d1", "text": "Pasta dough is flour and eggs.", "title": "Pasta"}
        if self.mode == "trickle-headers":  # a header a byte at a time: httpx's per-read timeout never trips
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(150):
                self.wfile.write(b"a")
                self.wfile.flush()
                time.sleep(0.2)
            return
        if self.mode == "gzip-bomb":  # 40 MB of spaces in 40 KB
            body = gzip.compress(b" " * 40_000_000, compresslevel=9)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.mode == "trickle":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "150")
            self.end_headers()
            for _ in range(150):  # 30 s in all: each byte well within any read timeout
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
            return
        if self.mode == "slow":  # a healthy node that takes 1.5 s to answer
            time.sleep(1.5)
        if self.mode.startswith("huge"):
            body = json.dumps({"candidates": [{**good, "text": "x" * 3_000_000}]}).encode()
        else:
            body = json.dumps({"candidates": [good, {**good, "doc_id": "d2", **self.row}], "failures": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.mode != "huge-chunked":
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), 65536):
                part = body[start:start + 65536]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def broken_node():
    handler = type("Handler", (_BrokenNode,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # a client that hangs up on a huge reply is expected
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", handler
    server.shutdown()
    server.server_close()


def test_callers_short_deadlines_hold_at_most_half_of_a_sources_workers(broken_node, tmp_path):
    """Issue 58 M1: requests with `timeout_s` 0.05 against a source that answers in 1.5 s each left a search
    holding a worker, until all were held and every other caller's search of it was refused as busy."""
    url, handler = broken_node
    handler.mode = "slow"
    ws = with_remote(tmp_path, url, guard="workers = 4\nbreaker_failures = 3", timeout_s=10)
    def hurried(_):
        try:
            return ws.search("pasta", method="rrf", k=3, timeout_s=0.05, sources=["team"]).failures
        except AllSourcesFailed as failed:
            return failed.failures

    with ThreadPoolExecutor(8) as clients:  # sent at once: checked as they start, not only once they are late
        failures = [f for found in clients.map(hurried, range(16)) for f in found]
    assert {f.reason for f in failures} == {"timeout", "busy"} and ws.guards["team"].late <= 2  # half of 4
    busy = next(f for f in failures if f.reason == "busy")
    assert "deadline shorter than its own" in busy.detail
    patient = ws.search("pasta", method="rrf", k=3)  # its own deadline: served meanwhile
    assert not patient.failures and any(c.source == "team" for c in patient.candidates)
    assert ws.guards.state("team") == "closed"


@pytest.mark.parametrize("mode", ["trickle", "trickle-headers"])
def test_a_remote_that_trickles_fails_within_its_timeout_whole_and_frees_its_worker(broken_node, tmp_path, mode):
    url, handler = broken_node
    handler.mode = mode
    ws = with_remote(tmp_path, url, timeout_s=1.5)
    result = ws.search("pasta", method="rrf", k=3)
    assert result.failures[0].reason == "timeout" and result.candidates
    _wait_until(lambda: ws.guards["team"].late == 0, seconds=10)  # its own deadline ended the read, not the 30 s
    with pytest.raises(SourceError, match=r"did not answer within 1.5 s \(timeout_s\)"):
        ws.source("team").search("pasta", 3)


def test_a_compressed_remote_reply_is_refused_unread(broken_node, tmp_path):
    """Review of round 5: max_reply_mb counted bytes after decompression, and one read of a 25 KB zstd reply
    decoded to 800 MB. Replies are asked for uncompressed; a compressed one is that source's failure."""
    url, handler = broken_node
    handler.mode = "gzip-bomb"
    ws = with_remote(tmp_path, url, max_reply_mb=1)
    result = ws.search("pasta", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["team"] and result.candidates
    assert "sent a compressed reply (gzip), which is not read" in result.failures[0].detail


@pytest.mark.parametrize("mode", ["huge", "huge-chunked"])
def test_a_remote_reply_larger_than_max_reply_mb_is_that_sources_failure(broken_node, tmp_path, mode):
    url, handler = broken_node
    handler.mode = mode
    ws = with_remote(tmp_path, url, max_reply_mb=1)
    result = ws.search("pasta", method="rrf", k=3)
    assert [f.source for f in result.failures] == ["team"] and result.candidates
    assert "larger than 1 MB (max_reply_mb)" in result.failures[0].detail


@pytest.mark.parametrize("row, where", [({"span": "ab"}, "candidates.1.span"),
                                        ({"location": {"file": "a.csv", "rows": ["a", "b"]}}, "candidates.1.location.rows"),
                                        ({"location": {"file": "a.pdf", "page": {"x": 1}}}, "candidates.1.location.page"),
                                        ({"text": None}, "candidates.1.text")])
def test_one_malformed_remote_row_fails_that_source_alone_on_every_path(broken_node, tmp_path, row, where):
    """Before, `"span": "ab"` and its like failed the whole request with 500 or 422, echoing pydantic."""
    url, handler = broken_node
    handler.mode, handler.row = "malformed", row
    ws = with_remote(tmp_path, url)
    with serving(create_app(ws)) as served:
        for path in ("/search", "/ask"):
            reply = httpx.post(served + path, json={"query": "pasta dough"}, timeout=60)
            assert reply.status_code == 200, reply.text
            failure = reply.json()["failures"][0]
            assert failure["source"] == "team" and f"malformed reply ({where}" in failure["detail"]
            assert "pydantic" not in reply.text and "errors.pydantic.dev" not in reply.text


def test_a_key_goes_over_plain_http_only_to_this_machine(tmp_path):
    config = tmp_path / "gradfuse.toml"
    for kind, address in (("gradfuse", 'url = "http://search.example:8321"'),
                          ("chroma", 'uri = "http://chroma.example:8000"\ncollection = "c"')):
        config.write_text(f'[sources.team]\nkind = "{kind}"\n{address}\nkey_env = "TEAM_KEY"\n')
        with pytest.raises(ConfigError, match="refusing to send TEAM_KEY over plain http to"):
            load_config(config)
    config.write_text('[sources.team]\nkind = "gradfuse"\nurl = "https://search.example:8321"\nkey_env = "TEAM_KEY"\n')
    load_config(config)  # https, or http to this machine, is fine
    config.write_text('[sources.team]\nkind = "gradfuse"\nurl = "http://127.0.0.1:8321"\nkey_env = "TEAM_KEY"\n')
    load_config(config)


def test_a_source_that_hangs_while_opening_delays_no_other_source_and_never_opens_their_breakers(tmp_path):
    """Review of round 5: sources were waited for in turn, and one hanging at open (a Chroma server that accepts
    connections and never answers, named first) left those after it no time: they failed, then their breakers
    opened. Each source is now asked as soon as it is open, against its own deadline."""
    import socket

    hole = socket.socket()  # accepts connections (the kernel's backlog), never answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    try:
        (tmp_path / "gradfuse.toml").write_text(
            f'workspace = "ws"\n[sources.aaa]\nkind = "chroma"\nuri = "http://127.0.0.1:{hole.getsockname()[1]}"\n'
            'collection = "c"\ntimeout_s = 1\n')  # its own deadline: a request's shorter one would not count
        ws = Workspace.open(tmp_path / "gradfuse.toml")
        ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
        assert ws.source_names() == ["aaa", "cooking"]  # the hanging one is opened first
        for _ in range(6):  # one more than breaker_failures
            found = ws.search("bread yeast", method="rrf", k=3)
            assert found.candidates[0].doc_id == "bread"
            assert [(f.source, f.reason) for f in found.failures] in ([("aaa", "timeout")], [("aaa", "open")])
        assert ws.guards.state("cooking") == "closed" and ws.guards.state("aaa") == "open"
    finally:
        hole.close()
