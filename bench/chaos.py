"""Chaos: eight sources behind one real `gradfuse serve`, four clients for 60 s, while some sources fail as real
engines and nodes fail; does every request for the healthy sources still succeed, how much slower, and how soon
does the server recover once the fault ends?

The sources (SciFact abstracts, 100 per source, from ../shared/data):
- `notes-0` … `notes-3`: gradfuse's own embedded indexes, never faulted (the healthy ones);
- `chroma`: a collection on Chroma's real server (`chroma run`);
- `remote`: a second `gradfuse serve`, asked for its source `far`;
- `node-a`, `node-b`: loopback nodes that relay to that second server (its sources `far-a`, `far-b`) and
  misbehave on demand, as a broken node or proxy would.

The faults: `hang` (the second server and Chroma paused by SIGSTOP: four sources), and on both nodes `trickle` (a
byte every 0.2 s), `crash` (half the reply, then the connection closed), `refuse` (nothing listens on the port) and
`garbage` (200 with bytes that are not JSON). Half the clients' requests name two of the healthy sources, the other
half name none (every source). Two rows without a fault: `none` (all eight answer) and `absent` (the "every
source" requests name the four healthy ones only, as if the others did not exist). The load is closed: four
requests are always in flight, so where all of them are cheap (`absent`) they compete for the two cores the most,
and the healthy requests' p50 is higher there than in `none`, whose every-source requests wait on remotes. The server runs its defaults ([guard]: 8 workers a source, a breaker opened by 5
failures in a row, 30 s cool-down), with timeout_s = 3 for every source and the result cache off. After each fault
ends, one request naming every source is sent every 0.5 s until no faulted source fails: that time is the recovery.

Then one key against another (issue 58): a second server with two keys, `alice` and `bob`, over the four healthy
sources, `remote`, `slow` (a node that relays after 1.5 s) and `down-a`, `down-b` (remotes nobody runs), routing
every question to 4 sources. alice's four clients send half their requests to two healthy sources, a quarter to
`remote`, `slow` and one healthy source, and a quarter to every source (routed), and open an MCP session every 5 s.
Row `keys, quiet`: alice alone. Row `abusive key`: bob at once asks `remote` for depth 500 twice a second (above its
`max_k`, which once opened its breaker for everyone), asks `slow` 15 times a second with `timeout_s` 0.05 (which
once held all of its workers), and opens 100 MCP sessions and keeps them alive (which once took every session).

Last, a watched folder under churn while a limited key and the owner ask (bench/chaos_watch.py says how; its
table is results/chaos/watched; `--rows watch` runs it alone).

Run: make bench-chaos (results/chaos/). `--seconds N` shortens each phase (for a look, not for the results file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from live_server import chroma_run, free_port, gradfuse_serve  # noqa: E402  (the tests' helpers)
from chaos_watch import markdown_rows, watch_row  # noqa: E402

from gradfuse import SourceSpec, Workspace  # noqa: E402
from gradfuse.config import load_config  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.ingest.documents import IngestReport, read_beir_corpus  # noqa: E402
from gradfuse.embedding.encoder import load_encoder  # noqa: E402

SCIFACT = Path(os.environ.get("GRADFUSE_DATA") or ROOT.parent / "shared" / "data") / "beir_scifact"
WORK = ROOT / ".gradfuse" / "bench" / "chaos"
OUT = ROOT / "results" / "chaos"
PER_SOURCE = 100
HEALTHY = [f"notes-{i}" for i in range(4)]
FAULTS = {"absent": [], "none": [], "hang": ["remote", "node-a", "node-b", "chroma"], "trickle": ["node-a", "node-b"],
          "crash": ["node-a", "node-b"], "refuse": ["node-a", "node-b"], "garbage": ["node-a", "node-b"]}
CLIENTS = 4
SLOW_S = 1.5  # how long the `slow` node waits before it relays
KEYS = {"alice": "alice-chaos-key", "bob": "bob-chaos-key"}
# Every request does its work: with the result cache on, a phase's questions repeated earlier phases' (the clients'
# seeds are the same) and were answered from it, so later phases looked faster than `none`.
NO_CACHE = ("[server]", "cache_mb = 0")
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "chaos", "version": "0"}}}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


class Node(BaseHTTPRequestHandler):
    """A gradfuse node in front of the second server: relays /search and /sources, or misbehaves as `mode` says."""

    upstream, mode = "", "relay"

    def do_GET(self):
        self._answer(httpx.get(self.upstream + self.path, timeout=30).content)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        mode = self.mode
        if mode == "slow":
            time.sleep(SLOW_S)
        if mode == "trickle":
            self._head(400)
            for _ in range(400):  # 80 s: each byte well within any read timeout
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
            return
        if mode == "garbage":
            self._answer(b"\x00\xffnot json at all" * 20)
            return
        reply = httpx.post(self.upstream + self.path, content=body, headers={"Content-Type": "application/json"},
                           timeout=30).content
        if mode == "crash":
            self._head(len(reply))
            self.wfile.write(reply[: len(reply) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # the process died mid-reply
            return
        self._answer(reply)

    def _head(self, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _answer(self, body: bytes) -> None:
        self._head(len(body))
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class NodeServer:
    """One node on a fixed port, which can stop listening (refuse) and listen again."""

    def __init__(self, upstream: str, mode: str = "relay"):
        self.handler = type("Handler", (Node,), {"upstream": upstream, "mode": mode})
        self.port = free_port()
        self._server = None
        self.listen()

    def listen(self) -> None:
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # a client that gives up is expected
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop_listening(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def scifact_documents() -> list[dict]:
    documents = read_beir_corpus(SCIFACT, IngestReport())
    return [{"id": d.doc_id, "title": d.title, "text": d.text} for _, d in zip(range(8 * PER_SOURCE), documents)]


def scifact_queries() -> list[str]:
    rows = [json.loads(line) for line in (SCIFACT / "queries.jsonl").read_text().splitlines() if line.strip()]
    return [r["text"] for r in rows]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load_chroma(url: str, rows: list[dict]) -> None:
    import chromadb

    port = int(url.rsplit(":", 1)[1])
    client = chromadb.HttpClient(host="127.0.0.1", port=port, settings=chromadb.Settings(anonymized_telemetry=False))
    vectors = load_encoder().encode([f"{r['title']}\n{r['text']}" for r in rows])
    client.create_collection("scifact", metadata={"hnsw:space": "cosine"}, embedding_function=None).add(
        ids=[r["id"] for r in rows], documents=[r["text"] for r in rows], metadatas=[{"title": r["title"]} for r in rows],
        embeddings=vectors.tolist())


def build_far(folder: Path, parts: dict[str, list[dict]]) -> Path:
    ws = Workspace(load_config(workspace=folder / "ws"))
    for name, rows in parts.items():
        ws.index(SourceSpec(name, "jsonl", str(write_jsonl(folder / f"{name}.jsonl", rows))))
    ws.close()
    return folder / "ws"


def main_config(folder: Path, chroma: str, far: str, nodes: dict[str, NodeServer]) -> Path:
    lines = ['workspace = "ws"', *NO_CACHE, "[defaults]", "timeout_s = 3.0", "[sources.chroma]", 'kind = "chroma"', f'uri = "{chroma}"',
             'collection = "scifact"', 'title_field = "title"', "[sources.remote]", 'kind = "gradfuse"',
             f'url = "{far}"', 'sources = ["far"]']
    for name, node in nodes.items():
        lines += [f"[sources.{name}]", 'kind = "gradfuse"', f'url = "{node.url}"', f'sources = ["far-{name[-1]}"]']
    config = folder / "gradfuse.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def halves(every: list[str] | None):
    """The fault rows' requests: half name two healthy sources, half every source (or `every` instead)."""
    return lambda rng: ("healthy", rng.sample(HEALTHY, 2)) if rng.random() < 0.5 else ("every", every)


def alices(rng: random.Random) -> tuple[str, list[str] | None]:
    """The key rows' requests: half to two healthy sources, a quarter to the remotes bob abuses, a quarter routed."""
    roll = rng.random()
    if roll < 0.5:
        return "healthy", rng.sample(HEALTHY, 2)
    return ("remotes", ["remote", "slow", rng.choice(HEALTHY)]) if roll < 0.75 else ("every", None)


def client_loop(url: str, queries: list[str], stop: threading.Event, seed: int, log: list, plan,
                headers: dict[str, str]) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=60, headers=headers) as http:
        while not stop.is_set():
            kind, sources = plan(rng)
            body = {"query": rng.choice(queries), "k": 5, **({"sources": sources} if sources else {})}
            started = time.perf_counter()
            try:
                reply = http.post("/search", json=body)
                status, payload = reply.status_code, reply.json() if reply.status_code == 200 else {}
            except httpx.HTTPError as error:
                status, payload = type(error).__name__, {}
            log.append({"kind": kind, "healthy_only": kind == "healthy", "status": status,
                        "ms": (time.perf_counter() - started) * 1000, "answered": bool(payload.get("candidates")),
                        "asked": sources or (payload.get("routing") or {}).get("asked", []),
                        "failures": {f["source"]: f["reason"] for f in payload.get("failures", [])}})


def clients(url: str, queries: list[str], seconds: float, log: list, plan=halves(None),
            headers: dict[str, str] | None = None) -> None:
    """CLIENTS clients sending requests one after another for `seconds`, each request's outcome into `log`; `plan`
    says which sources each names."""
    stop = threading.Event()
    threads = [threading.Thread(target=client_loop, args=(url, queries, stop, i, log, plan, headers or {}))
               for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()


def start_fault(fault: str, nodes: dict[str, NodeServer], processes: dict) -> None:
    if fault == "hang":
        for process in processes.values():
            process.send_signal(signal.SIGSTOP)
    for node in nodes.values():
        if fault == "refuse":
            node.stop_listening()
        elif fault in ("trickle", "crash", "garbage"):
            node.handler.mode = fault


def end_fault(fault: str, nodes: dict[str, NodeServer], processes: dict) -> None:
    if fault == "hang":
        for process in processes.values():
            process.send_signal(signal.SIGCONT)
    for node in nodes.values():
        if fault == "refuse":
            node.listen()
        node.handler.mode = "relay"


def recovery_seconds(url: str, query: str, faulted: list[str], limit: float = 120.0) -> float | None:
    """From the fault's end until a request naming every source has no faulted source failing."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            reply = httpx.post(url + "/search", json={"query": query, "k": 5}, timeout=30).json()
            if not {f["source"] for f in reply.get("failures", [])} & set(faulted):
                return round(time.monotonic() - started, 1)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return None


def summary(log: list, faulted: list[str]) -> dict:
    healthy = [r for r in log if r["healthy_only"]]
    every = [r for r in log if not r["healthy_only"]]
    ok = [r for r in healthy if r["status"] == 200 and r["answered"] and not r["failures"]]
    ms = np.array([r["ms"] for r in healthy]) if healthy else np.zeros(1)
    every_ms = np.array([r["ms"] for r in every]) if every else np.zeros(1)
    reasons: dict[str, int] = {}
    for r in every:
        for source, reason in r["failures"].items():
            reasons[reason] = reasons.get(reason, 0) + 1
    reported = [r for r in every if r["status"] == 200 and r["answered"] and set(faulted) <= set(r["failures"])]
    return {"healthy_requests": len(healthy), "healthy_succeeded": round(len(ok) / max(1, len(healthy)), 4),
            "healthy_p50_ms": round(float(np.percentile(ms, 50)), 1),
            "healthy_p99_ms": round(float(np.percentile(ms, 99)), 1),
            "all_source_requests": len(every),
            "all_source_answered": round(sum(r["status"] == 200 and r["answered"] for r in every) / max(1, len(every)), 4),
            "all_source_faults_reported": round(len(reported) / max(1, len(every)), 4) if faulted else None,
            "all_source_p50_ms": round(float(np.percentile(every_ms, 50)), 1),
            "failure_reasons": reasons,
            "other_statuses": sorted({str(r["status"]) for r in log if r["status"] != 200})}


def keyed_config(folder: Path, far: str, slow: NodeServer) -> Path:
    """The key rows' server: the built healthy sources, `remote`, `slow`, two remotes nobody runs, two keys, and
    every question routed to 4 sources."""
    lines = ['workspace = "ws"', *NO_CACHE, "[defaults]", "timeout_s = 3.0", "[routing]", "above = 0", "budget = 4",
             "[sources.remote]", 'kind = "gradfuse"', f'url = "{far}"', 'sources = ["far"]',
             "[sources.slow]", 'kind = "gradfuse"', f'url = "{slow.url}"', 'sources = ["far-a"]']
    for name in ("down-a", "down-b"):
        lines += [f"[sources.{name}]", 'kind = "gradfuse"', f'url = "http://127.0.0.1:{free_port()}"']
    for name, key in KEYS.items():
        lines += [f"[access.principals.{name}]", f'key_sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"',
                  'sources = ["*"]']
    config = folder / "keyed.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def repeat(stop: threading.Event, period: float, action) -> threading.Thread:
    """`action` every `period` seconds until `stop`, on its own thread."""
    def loop():
        while not stop.is_set():
            action()
            stop.wait(period)
    thread = threading.Thread(target=loop)
    thread.start()
    return thread


def status_of(send) -> int | str:
    try:
        return send().status_code
    except httpx.HTTPError as error:
        return type(error).__name__


def bob(url: str, queries: list[str], stop: threading.Event, log: dict[str, list]) -> list[threading.Thread]:
    """bob's three abuses at once, each on its own thread, each reply's status into log[abuse]."""
    rng = random.Random(7)
    key = {"X-API-Key": KEYS["bob"]}

    def search(abuse: str, **body):
        log[abuse].append(status_of(lambda: httpx.post(url + "/search", headers=key, timeout=30,
                                                       json={"query": rng.choice(queries), **body})))

    sessions: list[str] = []

    def hold_sessions():
        for session in sessions:  # a ping keeps each session from idling out
            httpx.post(url + "/mcp", json=PING, headers={**key, **MCP_HEADERS, "Mcp-Session-Id": session}, timeout=30)
        for _ in range(100 - len(sessions)):
            reply = httpx.post(url + "/mcp", json=INITIALIZE, headers={**key, **MCP_HEADERS}, timeout=30)
            log["sessions"].append(reply.status_code)
            if reply.status_code == 200:
                sessions.append(reply.headers["mcp-session-id"])

    return [repeat(stop, 0.5, lambda: search("depth 500", sources=["remote"], depth=500)),
            repeat(stop, 1 / 15, lambda: search("timeout_s 0.05", sources=["slow"], timeout_s=0.05)),
            repeat(stop, 20, hold_sessions)]


def alice_opens_mcp(url: str, stop: threading.Event, log: list) -> threading.Thread:
    """alice opens an MCP session every 5 s (and closes it): does bob leave her any?"""
    key = {"X-API-Key": KEYS["alice"], **MCP_HEADERS}

    def open_one():
        reply = httpx.post(url + "/mcp", json=INITIALIZE, headers=key, timeout=30)
        log.append(reply.status_code)
        if reply.status_code == 200:
            httpx.delete(url + "/mcp", headers={**key, "Mcp-Session-Id": reply.headers["mcp-session-id"]}, timeout=30)

    return repeat(stop, 5, open_one)


def key_rows(url: str, queries: list[str], seconds: float, results: ResultsFile) -> None:
    """`keys, quiet` (alice alone) and `abusive key` (bob at once), after an unrecorded warm-up."""
    clients(url, queries, min(seconds, 30.0), [], alices, {"X-API-Key": KEYS["alice"]})
    for row in ("keys, quiet", "abusive key"):
        print(f"{row}: {seconds:g} s", flush=True)
        log, opened, abuses = [], [], {"depth 500": [], "timeout_s 0.05": [], "sessions": []}
        stop = threading.Event()
        threads = [alice_opens_mcp(url, stop, opened), *(bob(url, queries, stop, abuses) if row != "keys, quiet"
                                                         else [])]
        clients(url, queries, seconds, log, alices, {"X-API-Key": KEYS["alice"]})
        stop.set()
        for thread in threads:
            thread.join()
        results.add(row, {"table": "keys", **key_summary(log),
                          "alice_mcp_opened": f"{opened.count(200)}/{len(opened)}",
                          "bob": {abuse: dict(Counter(str(s) for s in statuses)) for abuse, statuses in abuses.items()}
                          if row != "keys, quiet" else None})
        print(json.dumps(results.rows[row]), flush=True)


def key_summary(log: list) -> dict:
    healthy = [r for r in log if r["kind"] == "healthy"]
    ok = [r for r in healthy if r["status"] == 200 and r["answered"] and not r["failures"]]
    ms = np.array([r["ms"] for r in healthy]) if healthy else np.zeros(1)

    def answered_by(source: str) -> float:
        asked = [r for r in log if r["status"] == 200 and source in r["asked"]]
        return round(sum(source not in r["failures"] for r in asked) / max(1, len(asked)), 4)

    routed = [r for r in log if r["kind"] == "every"]
    return {"healthy_requests": len(healthy), "healthy_succeeded": round(len(ok) / max(1, len(healthy)), 4),
            "healthy_p50_ms": round(float(np.percentile(ms, 50)), 1),
            "healthy_p99_ms": round(float(np.percentile(ms, 99)), 1),
            "remote_answered": answered_by("remote"), "slow_answered": answered_by("slow"),
            "routed_requests": len(routed),
            "routed_answered": round(sum(r["status"] == 200 and r["answered"] for r in routed) / max(1, len(routed)),
                                     4),
            "other_statuses": sorted({str(r["status"]) for r in log if r["status"] != 200})}


def run(seconds: float, rows: str, results: ResultsFile) -> None:
    documents, queries = scifact_documents(), scifact_queries()
    parts = {name: documents[i * PER_SOURCE:(i + 1) * PER_SOURCE]
             for i, name in enumerate([*HEALTHY, "chroma", "far", "far-a", "far-b"])}
    WORK.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=WORK)))
        chroma_url, chroma_process = stack.enter_context(chroma_run(folder / "chroma"))
        load_chroma(chroma_url, parts["chroma"])
        far_processes = []
        far_url = stack.enter_context(gradfuse_serve(
            build_far(folder / "far", {n: parts[n] for n in ("far", "far-a", "far-b")}), processes=far_processes))
        nodes = {"node-a": NodeServer(far_url), "node-b": NodeServer(far_url)}
        config = main_config(folder, chroma_url, far_url, nodes)
        ws = Workspace.open(config)
        for name in HEALTHY:
            ws.index(SourceSpec(name, "jsonl", str(write_jsonl(folder / f"{name}.jsonl", parts[name]))))
        ws.close()
        if rows in ("all", "faults"):
            with gradfuse_serve(folder / "ws", "--config", str(config), log=folder / "serve.log") as url:
                processes = {"far": far_processes[0], "chroma": chroma_process}
                # Warm, unrecorded: models loaded, every source opened, the engines' and remotes' candidates
                # embedded once (held in memory), so the no-fault run is not measured cold.
                clients(url, queries, min(seconds, 30.0), [])
                for fault, faulted in FAULTS.items():
                    print(f"{fault}: {seconds:g} s, faulted: {', '.join(faulted) or 'none'}", flush=True)
                    log = []
                    start_fault(fault, nodes, processes)
                    clients(url, queries, seconds, log, halves(HEALTHY if fault == "absent" else None))
                    end_fault(fault, nodes, processes)
                    results.add(fault, {"table": "faults", "faulted": faulted, **summary(log, faulted),
                                        "recovery_s": recovery_seconds(url, queries[0], faulted) if faulted else None})
                    print(json.dumps(results.rows[fault]), flush=True)
        if rows in ("all", "keys"):
            keyed = keyed_config(folder, far_url, NodeServer(far_url, "slow"))
            with gradfuse_serve(folder / "ws", "--config", str(keyed), log=folder / "keyed.log") as url:
                key_rows(url, queries, seconds, results)


def markdown(results: ResultsFile, seconds: float) -> str:
    faults = {name: r for name, r in results.rows.items() if r["table"] == "faults"}
    keys = {name: r for name, r in results.rows.items() if r["table"] == "keys"}
    none, absent = faults["none"]["healthy_p50_ms"], faults["absent"]["healthy_p50_ms"]
    lines = ["# Chaos: each source fails alone, and one key abuses the others' sources", "",
             f"{results.provenance} 8 sources behind one `gradfuse serve` (bench/chaos.py's docstring says how), "
             f"{CLIENTS} clients for {seconds:g} s per fault, timeout_s 3, [guard] defaults, the result cache off. "
             "\"Healthy\" requests name two of the four local sources; "
             "\"every source\" requests name none (`absent`: the four healthy ones). Failure reasons count "
             "(request, source) pairs. Recovery: from the fault's end until a request naming every source has no "
             "faulted source failing (the breaker's cool-down is 30 s).", "",
             "| fault | faulted sources | healthy requests | succeeded | p50 ms (× none, × absent) | p99 ms | "
             "every-source requests answered | faults reported | failure reasons | recovery s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for fault, r in faults.items():
        reported = "–" if r["all_source_faults_reported"] is None else f"{r['all_source_faults_reported']:.2f}"
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["failure_reasons"].items())) or "–"
        lines.append(f"| {fault} | {', '.join(r['faulted']) or '–'} | {r['healthy_requests']} | "
                     f"{r['healthy_succeeded']:.3f} | {r['healthy_p50_ms']:.0f} ({r['healthy_p50_ms'] / none:.2f}×, "
                     f"{r['healthy_p50_ms'] / absent:.2f}×) | "
                     f"{r['healthy_p99_ms']:.0f} | {r['all_source_answered']:.3f} | {reported} | {reasons} | "
                     f"{'–' if r['recovery_s'] is None else r['recovery_s']} |")
    quiet = keys["keys, quiet"]["healthy_p50_ms"]
    lines += ["", "## One key against another", "",
              "A second server with keys `alice` and `bob` over the healthy sources, `remote`, `slow` (1.5 s), two "
              "remotes nobody runs, routing to 4 sources. alice's clients: half to two healthy sources (the columns "
              "\"healthy\"), a quarter to `remote` + `slow` + one healthy, a quarter routed; an MCP session every 5 s. "
              "In `abusive key`, bob at once asks `remote` for depth 500 twice a second, `slow` 15 times a second "
              "with timeout_s 0.05, and holds as many MCP sessions as he can (trying for 100). \"Answered\": the "
              "share of alice's requests naming that source that it answered.", "",
              "| row | alice's healthy requests | succeeded | p50 ms (× quiet) | p99 ms | `remote` answered | "
              "`slow` answered | routed requests answered | alice's MCP sessions opened | bob's replies |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row, r in keys.items():
        told = "–" if r["bob"] is None else "; ".join(
            f"{abuse}: " + ", ".join(f"{status} × {n}" for status, n in sorted(counts.items()))
            for abuse, counts in r["bob"].items())
        lines.append(f"| {row} | {r['healthy_requests']} | {r['healthy_succeeded']:.3f} | "
                     f"{r['healthy_p50_ms']:.0f} ({r['healthy_p50_ms'] / quiet:.2f}×) | {r['healthy_p99_ms']:.0f} | "
                     f"{r['remote_answered']:.3f} | {r['slow_answered']:.3f} | {r['routed_answered']:.3f} | "
                     f"{r['alice_mcp_opened']} | {told} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="each fault's phase (60 for the results file)")
    parser.add_argument("--rows", choices=("all", "faults", "keys", "watch"), default="all",
                        help="which rows to run (all for the results file)")
    args = parser.parse_args()
    if not SCIFACT.is_dir():
        raise SystemExit(f"no SciFact corpus at {SCIFACT} (the shared evaluation data)")
    complete = args.seconds == 60.0
    if not complete:
        print(f"(written to {WORK / 'look'}: results/chaos/ holds 60 s runs only)")
    if args.rows != "watch":
        results = ResultsFile.start(OUT if complete and args.rows == "all" else WORK / "look", "make bench-chaos",
                                    seconds_per_fault=args.seconds, clients=CLIENTS, sources=8,
                                    documents_per_source=PER_SOURCE, timeout_s=3.0, result_cache="off",
                                    guard="defaults (workers 8, breaker_failures 5, breaker_cooldown_s 30)")
        run(args.seconds, args.rows, results)
        results.finish(markdown(results, args.seconds) if args.rows == "all" else None)
    if args.rows in ("all", "watch"):  # a server of its own, a table of its own (results/chaos/watched)
        watched = ResultsFile.start((OUT if complete else WORK / "look") / "watched", "make bench-chaos",
                                    seconds=args.seconds, result_cache="off")
        print(f"watched folder under churn: {args.seconds:g} s", flush=True)
        WORK.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=WORK) as folder:
            watched.add("watched folder", watch_row(Path(folder), args.seconds))
        print(json.dumps(watched.rows["watched folder"]), flush=True)
        watched.finish("\n".join(markdown_rows(watched.rows["watched folder"], watched.provenance)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
