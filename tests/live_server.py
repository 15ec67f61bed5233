"""A real uvicorn server on a free loopback port, in a thread of the test process (so a test can shape its
workspace, e.g. give it a source that hangs), or as a `gradfuse serve` subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families


@contextmanager
def serving(app):
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class Scraped:
    """A server's /metrics, read with prometheus_client's own parser; called with a sample's name and labels, the
    sample's value (None where it has none)."""

    def __init__(self, url: str, **headers: str):
        reply = httpx.get(url + "/metrics", headers=headers, timeout=30)
        assert reply.status_code == 200, reply.text
        self.text = reply.text
        self.families = {f.name: f for f in text_string_to_metric_families(reply.text)}
        self._values = {(s.name, frozenset(s.labels.items())): s.value
                        for family in self.families.values() for s in family.samples}

    def __call__(self, name: str, **labels: str) -> float | None:
        return self._values.get((name, frozenset(labels.items())))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def gradfuse_serve(workspace: Path, *extra: str, env: dict[str, str] | None = None, log: Path | None = None,
                   processes: list | None = None):
    """`gradfuse serve` as its own process, as a user starts it; yields the base URL once /healthz answers.
    `log`: a file that gets the server's output (otherwise it is read only if the server fails to start);
    `processes`: a list that gets the process (to pause or kill it)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "gradfuse"), "serve", "--workspace", str(workspace), "--port", str(port),
               "--log-level", "warning", *extra]
    output = open(log, "w") if log else subprocess.PIPE
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=output,
                               stderr=subprocess.STDOUT, text=True)
    if processes is not None:
        processes.append(process)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gradfuse serve exited: {log.read_text() if log else process.stdout.read()}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("gradfuse serve did not answer /healthz within 120 s")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGCONT)  # a test may have paused it
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        if log:
            output.close()


@contextmanager
def chroma_run(folder: Path, port: int | None = None):
    """Chroma's real server (`chroma run` from the chromadb wheel) on loopback, for the tests and the benchmarks
    alike; yields its URL and process (to pause or kill it) once its heartbeat answers."""
    port = port or free_port()
    process = subprocess.Popen([str(Path(sys.executable).with_name("chroma")), "run", "--path", str(folder),
                                "--host", "127.0.0.1", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(url + "/api/v2/heartbeat", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chroma run did not start on port {port} (is the port taken?)")
            time.sleep(0.2)
        yield url, process
    finally:
        process.send_signal(signal.SIGCONT)  # a test may have paused it
        process.kill()
        process.wait()


class _OpenAIChatHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/chat/completions endpoint backed by the real local model. It never streams (one
    JSON completion, as some servers answer), except with `empty_stream`: an event stream with no text."""

    model = None
    empty_stream = False
    authorizations: list = []  # the Authorization header of each request ("" when none was sent)

    def do_POST(self):
        self.authorizations.append(self.headers.get("Authorization", ""))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.empty_stream and body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"data: [DONE]\n\n")
            return
        text = self.model.generate(body["messages"], max_new_tokens=body["max_tokens"])
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@contextmanager
def openai_endpoint(model, *, empty_stream: bool = False):
    """An OpenAI-compatible endpoint on a loopback port, answering with `model` (a real local generator)."""
    handler = type("Handler", (_OpenAIChatHandler,), {"model": model, "empty_stream": empty_stream,
                                                      "authorizations": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler.authorizations
    finally:
        server.shutdown()
        server.server_close()
