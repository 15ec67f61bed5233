"""Load on `gradfuse serve`: requests/s and latency percentiles of POST /search, with a fusion method (rrf) and
with the full method (gro), over the nine sources of the federated benchmark and its real queries.

Run: make bench-serve. The server is a real `gradfuse serve` process on loopback; the client is a thread pool in
this process on the same machine (it shares the cores with the server, which the results file says).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from live_server import gradfuse_serve  # noqa: E402

from gradfuse import Workspace  # noqa: E402
from gradfuse.config import Config  # noqa: E402
from gradfuse.eval.benchmark import load_benchmark, read_qrels, sample_queries  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402

# (method, stage-2 target, concurrent clients, requests): rrf at the load the issue asks for and below it; gro
# alone with each honest target (n = 10 passages of up to 128 tokens, the defaults), then at the LM line's sizes
# (one runs at a time; lm_queue = 8 admits eight) and one burst above it, where refusals are expected.
PLAN = [("rrf", None, 1, 200), ("rrf", None, 8, 400), ("rrf", None, 50, 500),
        ("gro", "query", 1, 20), ("gro", "draft", 1, 20), ("gro", "draft", 4, 16), ("gro", "draft", 16, 24)]
SEARCH = {"k": 10, "retrieval": "bm25"}  # every request's body beside its query, method and target


@dataclass
class Level:
    method: str
    target: str | None
    concurrency: int
    requests: int
    ok: int
    refused: int  # 503 from the LM line
    errors: int  # anything else
    error_examples: list[str]
    seconds: float
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    max_ms: float


def queries_of(bench) -> list[str]:
    texts = []
    for query_set in bench.query_sets.values():
        texts += [q.text for q in sample_queries(bench, query_set, read_qrels(query_set))]
    rng = np.random.default_rng(0)
    return [texts[i] for i in rng.permutation(len(texts))]


def run_level(url: str, method: str, target: str | None, concurrency: int, queries: list[str]) -> Level:
    client = httpx.Client(timeout=600)

    errors: list[str] = []
    body = {"method": method, **SEARCH, **({"target": target} if target else {})}

    def one(query: str) -> tuple[int, float]:
        started = time.perf_counter()
        response = client.post(url + "/search", json={"query": query, **body})
        if response.status_code not in (200, 503):
            errors.append(f"{response.status_code}: {response.text[:200]}")
        return response.status_code, time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(one, queries))
    seconds = time.perf_counter() - started
    served = np.array([s for status, s in outcomes if status == 200]) * 1000
    refused = sum(status == 503 for status, _ in outcomes)
    percentile = (lambda p: float(np.percentile(served, p))) if len(served) else (lambda p: float("nan"))
    return Level(method, target, concurrency, len(queries), len(served), refused, len(errors), errors[:3], seconds, len(served) / seconds, percentile(50), percentile(95),
                 float(served.max()) if len(served) else float("nan"))


def main() -> None:
    bench = load_benchmark(ROOT / "benchmarks" / "federated.toml")
    ws = Workspace(Config(workspace=bench.workspace))
    for spec in bench.sources.values():
        ws.index(spec, progress=True)  # a no-op when the benchmark has built them already
    queries = queries_of(bench)
    results = ResultsFile.start(ROOT / "results" / "serve", "make bench-serve", sources=len(bench.sources),
                                search=SEARCH)
    with gradfuse_serve(bench.workspace, "--preload-lm", env={"GRADFUSE_API_KEY": ""}) as url:
        run_level(url, "rrf", None, 4, queries[:40])  # warm-up: page cache, encoder, first requests
        run_level(url, "gro", "draft", 1, queries[:2])
        offset = 40
        for method, target, concurrency, count in PLAN:
            batch = (queries * 2)[offset:offset + count]
            offset += count
            level = run_level(url, method, target, concurrency, batch)
            print(f"{method}/{target} x{concurrency}: {level.requests_per_s:.1f} req/s, p50 {level.p50_ms:.0f} ms, "
                  f"p95 {level.p95_ms:.0f} ms, {level.refused} refused, {level.errors} errors", flush=True)
            results.add(f"{label(method, target)} x{concurrency}", asdict(level))
    results.finish(markdown(results))


def label(method: str, target: str | None) -> str:
    return f"{method}/{target}" if target else method


def markdown(results: ResultsFile) -> str:
    sources = results.header["sources"]
    rows = "\n".join(
        f"| {label(lv['method'], lv['target'])} | {lv['concurrency']} | {lv['requests']} | {lv['ok']} | "
        f"{lv['refused']} | {lv['errors']} | {lv['requests_per_s']:.2f} | {lv['p50_ms']:.0f} | {lv['p95_ms']:.0f} | "
        f"{lv['max_ms']:.0f} |" for lv in results.rows.values())
    return f"""# gradfuse serve under load

{results.provenance}
Server: `gradfuse serve --preload-lm` on loopback over the {sources} sources of benchmarks/federated.toml
(BM25 per source, depth 20, k 10); requests are that benchmark's real queries, each `POST /search` with
`retrieval: bm25`. The client is a thread pool in the benchmark process on the same two cores as the server.
Latency is per request, from send to full response, over the requests served (200). Stage 2 runs with the
library's defaults (n = 10 passages of up to 128 tokens, the reader-gate estimator, fp32); `gro/draft` first
drafts an answer of up to 32 tokens from the documents' cache, which the gradient pass then reuses.

| method | concurrent | requests | served | refused (503) | errors | requests/s | p50 ms | p95 ms | max ms |
|---|---|---|---|---|---|---|---|---|---|
{rows}

How the model is shared: one process, the encoder and the scoring LM loaded once; fusion requests run in
parallel threads; a request that needs a model per query (gradient, gro, the LM baselines, loo, loo-greedy, and /ask
with the local generator)
takes a place in a line of `lm_queue` = 8 (running or waiting), and its LM passes run one at a time under the
model's lock, since torch already uses every core for one pass. A request beyond the line is refused at once
with 503 and Retry-After, so the line never grows into minutes and fusion requests never wait behind it.
"""


if __name__ == "__main__":
    main()
