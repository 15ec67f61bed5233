"""A real uvicorn server on a free loopback port, in a thread of the test process (so a test can shape its
workspace, e.g. give it a source that hangs), or as a `gradfuse serve` subprocess."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
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


RAY_ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class TwoNodeCluster:
    """`ray start --head` and `ray start --address` as the user would run them, each in its own process group so
    a node can be killed whole (raylet and workers) with kill -9."""

    def __init__(self):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix="gfray", dir="/tmp")  # Ray's socket paths must stay short
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0", "--object-store-memory=100000000",
                  "--disable-usage-stats", "--block"]
        ray = str(Path(sys.executable).parent / "ray")
        self.head_command = [ray, "start", "--head", f"--port={self.port}", "--include-dashboard=false",
                             f"--temp-dir={self.temp_dir}", *common]
        self.worker_command = [ray, "start", f"--address={self.address}", *common]
        self.head = self.worker = None

    def start(self, nodes: int = 2) -> None:
        """The head, and the second node unless `nodes` is 1."""
        self.head = self._spawn(self.head_command)
        self._wait_for_nodes(1)
        if nodes == 2:
            self.start_worker()

    def start_worker(self) -> None:
        self.worker = self._spawn(self.worker_command)
        self._wait_for_nodes(2)

    def kill_worker(self) -> None:
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait()

    def stop(self) -> None:
        for process in (self.worker, self.head):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in (self.worker, self.head):
            if process is not None:
                try:
                    process.wait(timeout=5)  # a node took 15-20 s to stop by itself; its processes die anyway
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-9", "-f", self.temp_dir], check=False)  # anything of this cluster left behind
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _spawn(self, command) -> subprocess.Popen:
        return subprocess.Popen(command, env=RAY_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def _wait_for_nodes(self, count: int, timeout_s: float = 90) -> None:
        probe = ("import ray; ray.init(address=%r, log_to_driver=False, logging_level='ERROR'); "
                 "print(sum(n['Alive'] for n in ray.nodes()))" % self.address)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = subprocess.run([sys.executable, "-c", probe], env=RAY_ENV, capture_output=True, text=True,
                                  timeout=60)
            if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster did not reach {count} node(s) within {timeout_s:.0f} s")
