"""Indexing speed and search latency of the skeleton on real data (issue 2's measurement).

Sources: beir_scifact, classic_cranfield and hotpotqa_train100_hipporag from ../shared/data, each one source.
Queries: the 300 SciFact test queries. For every uniform fusion baseline and retrieval mode it reports
p50/p95 search latency and nDCG@10 / Recall@100 against SciFact's qrels (scored by ranx), with the other two
sources as distractors. Writes results/skeleton/scifact.{md,json}.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from ranx import Qrels, Run, evaluate

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.embedding.encoder import load_encoder
from gradfuse.eval.record import ResultsFile

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
OUT = Path(__file__).resolve().parents[1] / "results" / "skeleton"
SOURCES = {"scifact": "beir_scifact", "cranfield": "classic_cranfield", "hotpotqa": "hotpotqa_train100_hipporag"}
METHODS = ["concat", "rrf", "combsum", "combsum-z", "combmnz", "combmnz-z", "single:scifact"]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def read_qrels(path: Path, source: str) -> Qrels:
    """The shared layout's qrels (`query_id<TAB>doc_id<TAB>relevance`, no header), doc ids namespaced by source."""
    judged: dict[str, dict[str, int]] = {}
    for line in open(path):
        query_id, doc_id, relevance = line.rstrip("\n").split("\t")
        judged.setdefault(query_id, {})[f"{source}/{doc_id}"] = int(relevance)
    return Qrels(judged)


def main(workspace_dir: Path) -> None:
    started = time.perf_counter()
    results = ResultsFile.start(OUT, "make bench-skeleton", name="scifact", builds={})
    ws = Workspace(Config(workspace=workspace_dir, depth=100, k=100))
    for name, folder in SOURCES.items():
        report = ws.index(SourceSpec(name, "beir", str(DATA / folder)), progress=True)
        results.header["builds"][name] = {"documents": report.documents, "seconds": round(report.seconds, 2),
                                          "docs_per_s": round(report.docs_per_second, 1), "status": report.status,
                                          "embedded_now": report.embedded_now}
        print(name, results.header["builds"][name], flush=True)
    queries = [json.loads(line) for line in open(DATA / "beir_scifact" / "queries.jsonl")]
    qrels = read_qrels(DATA / "beir_scifact" / "qrels.tsv", "scifact")
    ws.search(queries[0]["text"], method="rrf")  # warm-up: loads the encoder, compiles ranx's numba kernels
    for method in METHODS:
        ws.search(queries[0]["text"], method=method)
    for retrieval in ("bm25", "dense", "hybrid"):
        for query in queries[-20:]:  # warm each mode's code paths and the memory-mapped vectors before timing
            ws.search(query["text"], method="concat", retrieval=retrieval)
        for method in METHODS:
            latencies, run = [], {}
            load_encoder().clear_query_cache()  # every method meets the queries cold, as a user's first search
            for query in queries:
                began = time.perf_counter()
                result = ws.search(query["text"], method=method, retrieval=retrieval)
                latencies.append((time.perf_counter() - began) * 1000)
                assert not result.failures, result.failures
                # Keys are namespaced, so a distractor source's document holds its rank as a miss.
                run[query["id"]] = {c.key: float(len(result.candidates) - i) for i, c in enumerate(result.candidates)}
            with warnings.catch_warnings():  # numba's integer-cast warning, once per metric
                warnings.simplefilter("ignore")
                scores = evaluate(qrels, Run(run), ["ndcg@10", "recall@100"])
            row = {"retrieval": retrieval, "method": method, "queries": len(queries),
                   "p50_ms": round(percentile(latencies, 50), 2), "p95_ms": round(percentile(latencies, 95), 2),
                   "ndcg@10": round(float(scores["ndcg@10"]), 4), "recall@100": round(float(scores["recall@100"]), 4)}
            results.add(f"{retrieval} · {method}", row)
            print(row, flush=True)
    seconds = time.perf_counter() - started
    results.finish(markdown(results, seconds), wall_seconds=round(seconds))


def markdown(results: ResultsFile, seconds: float) -> str:
    lines = [
        "# Skeleton on real data: beir_scifact (+ cranfield and hotpotqa as distractor sources)",
        "",
        f"{results.provenance} Wall time {seconds / 60:.1f} min.",
        "",
        "## Indexing (cold: no embedding cache)",
        "",
        "| source | documents | seconds | docs/s |",
        "|---|---:|---:|---:|",
        *[f"| {n} | {b['documents']} | {b['seconds']} | {b['docs_per_s']} |"
          for n, b in results.header["builds"].items()],
        "",
        "Indexing time is dominated by MiniLM embedding (bf16); BM25 indexing in tantivy is a small part of it.",
        "",
        "## Search over three sources: 300 SciFact test queries, depth 100 per source, k = 100",
        "",
        "Latency is the whole `Workspace.search` call (concurrent source queries + dedup + fusion), after warm-up.",
        "nDCG@10 / Recall@100 use SciFact's qrels; documents from the two distractor sources count as misses.",
        "",
        "| retrieval | fusion | p50 ms | p95 ms | nDCG@10 | Recall@100 |",
        "|---|---|---:|---:|---:|---:|",
        *[f"| {r['retrieval']} | {r['method']} | {r['p50_ms']} | {r['p95_ms']} | {r['ndcg@10']} | {r['recall@100']} |"
          for r in results.rows.values()],
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(tmp) / "ws")
