"""Stage 2 on a real Ray cluster on this machine: a head and a second node joined on loopback (one CPU each),
started and stopped here. An evaluation on the cluster gives the local run's numbers, also when the second node
is killed with kill -9 in the middle; the service keeps answering when a scorer replica dies; without a cluster
or without Ray the error says so."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from live_server import RAY_ENV as ENV, TwoNodeCluster, free_port, gradfuse_serve

pytest.importorskip("ray", reason="Ray is in the [test] extra; `make install` installs it")

from test_eval import BENCHMARKS, _shared_data, needs_data  # noqa: E402

pytestmark = pytest.mark.usefixtures("bench_workspaces")  # see conftest.py

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster():
    nodes = TwoNodeCluster()
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


def _bench_file(tmp_path: Path, name: str) -> Path:
    """DL19's quick variant under its own name (so its scoring-LM outcomes cache starts empty), with absolute
    paths, only the methods this test compares, and a smaller scoring-LM subsample."""
    text = (BENCHMARKS / "dl19.toml").read_text()
    text = re.sub(r'^name = .*$', f'name = "{name}"', text, count=1, flags=re.M)
    text = re.sub(r'^data = .*$', f'data = "{_shared_data()}"', text, count=1, flags=re.M)
    text = text.replace('"../.gradfuse/', f'"{REPO}/.gradfuse/')
    text, methods = re.subn(r'^methods = \["single:\*".*$', 'methods = ["dense", "gro/query", "upr"]', text,
                            flags=re.M)
    # Two test and two dev queries for the scoring LM (three runs of the benchmark: locally, on the cluster, and
    # on the cluster losing a node): enough to compare every number, a third of the time.
    text, lm = re.subn(r'^lm = \{ dtype = "float32", sample = \d+,', 'lm = { dtype = "float32", sample = 2, dev_sample = 2,',
                       text, flags=re.M)
    assert methods == 1 and lm == 1, "dl19.toml's quick variant changed: update this test's edits of it"
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _eval(bench: Path, out: Path, *extra: str, during=None) -> tuple[dict, str]:
    """`gradfuse eval --quick` with one torch thread (as each one-CPU replica has), so the local and the cluster
    runs do the same arithmetic; `during(process)` runs while it works."""
    command = [str(BIN / "gradfuse"), "eval", str(bench), "--quick", "--out", str(out), "--runs", str(out / "runs"),
               *extra]
    log = out.with_suffix(".log")  # a file, not a pipe: nobody reads a pipe while `during` waits
    with log.open("w") as output:
        process = subprocess.Popen(command, env={**ENV, "OMP_NUM_THREADS": "1"}, stdout=output,
                                   stderr=subprocess.STDOUT)
        if during is not None:
            during(process)
        process.wait(timeout=900)
    assert process.returncode == 0, log.read_text()[-4000:]
    return json.loads((out / "results.json").read_text()), log.read_text()


def _numbers(summary: dict) -> list:
    """Every table's rows without their timings, and every tuned value."""
    rows = [[{k: v for k, v in row.items() if k != "ranking_ms_p50"} for row in table["rows"]]
            for table in summary["tables"]]
    return [rows, summary["tuned"], summary["queries"]]


@needs_data
@pytest.mark.slow
def test_an_eval_on_the_cluster_gives_the_local_numbers_even_when_a_node_dies(cluster, tmp_path):
    name = f"ray-test-{uuid.uuid4().hex[:8]}"
    bench = _bench_file(tmp_path, name)
    cache = REPO / ".gradfuse" / "bench" / "dl19-runs-quick" / "eval-cache" / f"{name}-quick"  # a quick variant's name
    try:
        local, _ = _eval(bench, tmp_path / "local")
        shutil.rmtree(cache)

        def kill_the_worker_mid_run(process):
            """Once the first scoring-LM outcome is written (the replicas are busy), kill -9 the second node."""
            deadline = time.monotonic() + 600
            while not any(f.stat().st_size for f in cache.glob("*.jsonl")):
                assert process.poll() is None and time.monotonic() < deadline, "the run ended before any LM outcome"
                time.sleep(0.2)
            cluster.kill_worker()

        survived, output = _eval(bench, tmp_path / "lost-node", "--ray", cluster.address,
                                 during=kill_the_worker_mid_run)
        # It started with both nodes' replicas (one run, not one whole and one with a failure: each takes a
        # minute; the second may still be starting when the first is ready), noticed the dead one and carried on,
        # with the local numbers.
        assert re.search(r"run on the Ray cluster \S+: (2 CPU scorer replica\(s\)|1 CPU scorer replica\(s\), "
                         r"1 starting)", output), output[:300]
        assert "lost" in output
        assert _numbers(survived) == _numbers(local)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if cluster.worker.poll() is not None:
            cluster.start_worker()  # the next test gets both nodes again


@needs_data
def test_a_build_on_the_cluster_has_the_local_build_s_vectors_even_when_a_node_dies(cluster, tmp_path):
    import sqlite3

    import numpy as np

    from gradfuse.sources.base import current_version

    lines = (_shared_data() / "beir_scifact" / "corpus.jsonl").read_text().splitlines()[:800]
    corpus = tmp_path / "scifact.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    embedded = tmp_path / "cluster" / "cache" / "embeddings.sqlite"

    def stored() -> int:
        try:
            with sqlite3.connect(f"file:{embedded}?mode=ro", uri=True) as db:
                return db.execute("SELECT count(*) FROM vectors").fetchone()[0]
        except sqlite3.Error:  # not there yet, or being written
            return 0

    try:
        build = subprocess.Popen([str(BIN / "gradfuse"), "index", "jsonl", str(corpus), "--source", "sci",
                                  "--workspace", str(tmp_path / "cluster"), "--ray", cluster.address],
                                 env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 600
        while stored() < 256:  # two batches back from the cluster: both nodes are embedding
            assert build.poll() is None and time.monotonic() < deadline, "the build ended before it was half done"
            time.sleep(0.1)
        cluster.kill_worker()
        output, _ = build.communicate(timeout=600)
        assert build.returncode == 0, output[-3000:]
        assert "Ray at " in output and "800 embedded now" in output, output[-3000:]
        local = subprocess.run([str(BIN / "gradfuse"), "index", "jsonl", str(corpus), "--source", "sci",
                                "--workspace", str(tmp_path / "local")], env={**ENV, "OMP_NUM_THREADS": "1"},
                               capture_output=True, text=True)
        assert local.returncode == 0, local.stdout[-3000:]
        on_cluster, here = (np.load(current_version(tmp_path / where / "sources" / "sci") / "embeddings.npy")
                            for where in ("cluster", "local"))
        assert on_cluster.shape == here.shape == (800, 384)
        np.testing.assert_allclose(on_cluster, here, atol=1e-5)
    finally:
        if cluster.worker.poll() is not None:
            cluster.start_worker()  # the next test gets both nodes again


@pytest.mark.slow
def test_the_service_keeps_answering_when_a_replica_dies(cluster, workspace, tmp_path):
    config = tmp_path / "gradfuse.toml"
    # Extractive answers: /ask's only LM work is its evidence by the gate, scored on the replicas like stage 2's
    # passes (the default evidence scorer needs no LM).
    config.write_text(f'[generator]\nanswer = "extractive"\n[evidence]\nscorer = "gate"\n[server]\n'
                      f'ray = "{cluster.address}"\nray_replicas = 2\nlm_queue = 1\n'
                      'cache_mb = 0\n')  # every request reaches a replica, not the result cache
    body = {"query": "which planet has two moons", "method": "gro", "target": "query", "n": 3, "k": 3}

    def replicas() -> list[str]:
        """This server's replicas: an earlier test's may still be stopping on the same cluster."""
        listed = subprocess.run(["pgrep", "-f", "ray::ScorerReplica"], capture_output=True, text=True).stdout.split()
        return [pid for pid in listed if pid not in earlier]

    earlier = set(subprocess.run(["pgrep", "-f", "ray::ScorerReplica"], capture_output=True, text=True).stdout.split())
    with gradfuse_serve(workspace.root, "--config", str(config), env=ENV, log=tmp_path / "serve.log") as url:
        assert httpx.get(url + "/healthz").json()["scorer_replicas"] == 2
        # The LM line counts the replicas: lm_queue 1 with two replicas admits two at once, not one.
        drafts = {**body, "target": "draft", "scorer": "gradient"}  # a drafted answer: long enough to overlap
        with ThreadPoolExecutor(max_workers=4) as pool:
            statuses = sorted(pool.map(lambda _: httpx.post(url + "/search", json=drafts, timeout=120).status_code,
                                       range(4)))
        assert statuses.count(200) == 2 and statuses.count(503) == 2, statuses
        first = httpx.post(url + "/search", json=body, timeout=120)
        assert first.status_code == 200, first.text
        serving = replicas()
        assert len(serving) == 2
        os.kill(int(serving[0]), signal.SIGKILL)
        for _ in range(4):  # every request is answered, whichever replica it meets first
            answer = httpx.post(url + "/search", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["candidates"][0]["key"] == first.json()["candidates"][0]["key"]
        deadline = time.monotonic() + 60
        while len(replicas()) < 2:  # a replacement takes the freed CPU
            assert time.monotonic() < deadline, "no replacement replica started"
            time.sleep(0.5)
        assert httpx.get(url + "/healthz").json()["scorer_replicas"] == 2
        asked = httpx.post(url + "/ask", json={"query": body["query"], "method": "dense", "k": 3}, timeout=120)
        assert asked.status_code == 200, asked.text
    local = workspace.evidence(body["query"], workspace.search(body["query"], method="dense", k=3).candidates,
                               settings=dataclasses.replace(workspace.config.evidence, scorer="gate"))
    remote = asked.json()["evidence"]
    assert [(e["doc_id"], tuple(e["span"])) for e in remote] == [(e.doc_id, e.span) for e in local[:len(remote)]]
    assert [e["score"] for e in remote] == pytest.approx([e.score for e in local[:len(remote)]], abs=1e-5)


def test_without_a_cluster_or_without_ray_the_error_is_clear(tmp_path):
    gradfuse = str(BIN / "gradfuse")
    nobody = f"127.0.0.1:{free_port()}"
    done = subprocess.run([gradfuse, "eval", str(BENCHMARKS / "dl19.toml"), "--quick", "--ray", nobody],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 2
    assert f"cannot reach the Ray cluster at {nobody}" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    without_ray = ("import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
                   "from gradfuse.execute import LOCAL, RayUnavailable, make_executor\n"
                   "assert make_executor(None) is LOCAL and make_executor('') is LOCAL\n"
                   "try:\n    make_executor('auto')\nexcept RayUnavailable as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", without_ray], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Ray is not installed: pip install 'gradfuse[ray]'" in done.stdout


def test_a_port_that_answers_but_is_not_ray_is_refused_at_once_and_the_build_lock_let_go(tmp_path):
    """An HTTP server where the cluster should be: ray.init waited minutes there, holding the source's lock."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "The tide gauge reads hourly."}\n')
    command = [str(BIN / "gradfuse"), "index", "jsonl", str(corpus), "--source", "tides",
               "--workspace", str(tmp_path / "ws")]
    try:
        done = subprocess.run([*command, "--ray", address], capture_output=True, text=True, env=ENV, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    assert f"{address} answers, but not as a Ray cluster does" in " ".join((done.stdout + done.stderr).split())
    assert subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300).returncode == 0
