"""How cost grows with the corpus, and how the scoring LM scales over Ray replicas. Run: make bench-scale.

1. Passages: every corpus of the shared data (real, about 45k), shuffled with a seed; sizes beyond them are filled
   with copies of those passages (same text, new ids), labelled as copies. Their vectors come from the shared
   benchmark workspace's embedding cache, so build times do not include encoding; encoding is measured apart
   (passages/s) to say what a fresh corpus adds.
2. At 10k, 50k, 200k and 1M passages: the embedded store's build time (`gradfuse index`'s code path), its size on
   disk and in memory (RSS growth of a fresh process that opens it and searches), and retrieval p50/p95 for BM25,
   exact dense search and the IVF index (faiss), with the IVF's recall@10 against exact search. With copies a
   passage's top 10 holds equal scores, so recall counts an approximate hit whose score reaches the exact 10th.
3. Scoring-LM throughput on a Ray cluster started here (one head, 2 CPUs): 1 and 2 replicas, as a ratio, next to
   this process alone; and a sizing for a GPU cluster from the FLOP count of the passes (no GPU was measured).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from live_server import free_port  # noqa: E402

from gradfuse.eval.benchmark import load_benchmark  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.sources import SourceSpec  # noqa: E402
from gradfuse.indexing.build import build_source  # noqa: E402
from gradfuse.ingest.documents import IngestReport, read_beir_corpus  # noqa: E402

SIZES = [10_000, 50_000, 200_000, 1_000_000]
ENCODER = "all-MiniLM-L6-v2"  # the default encoder (bf16), as the federated benchmark's sources use it
WORKSPACE = ROOT / ".gradfuse" / "bench" / "shared-sources"  # its embedding cache holds the shared corpora
QUERIES = 200
OUT = ROOT / "results" / "scale"


def real_passages(data: Path) -> list[dict]:
    passages = []
    for folder in sorted(p for p in data.iterdir() if (p / "corpus.jsonl").is_file()):
        for document in read_beir_corpus(folder, IngestReport(), skip_malformed=True):
            passages.append({"id": f"{folder.name}/{document.doc_id}", "title": document.title,
                             "text": document.text})
    order = np.random.default_rng(0).permutation(len(passages))
    return [passages[i] for i in order]


def real_queries(data: Path) -> list[str]:
    texts = []
    for folder in sorted(p for p in data.iterdir() if (p / "queries.jsonl").is_file()):
        lines = (folder / "queries.jsonl").read_text().split("\n")  # not splitlines(): texts may hold U+2028
        texts += [json.loads(line)["text"] for line in lines if line.strip()]
    rng = np.random.default_rng(1)
    return [texts[i][:2000] for i in rng.choice(len(texts), QUERIES, replace=False)]


def write_corpus(path: Path, real: list[dict], size: int) -> int:
    """The first `size` passages of: the real ones, then copy 1 of each, copy 2, ... Returns how many are copies."""
    with path.open("w") as handle:
        for i in range(size):
            passage = real[i % len(real)]
            copy = i // len(real)
            record = passage if copy == 0 else {**passage, "id": f"{passage['id']}~copy{copy}"}
            handle.write(json.dumps(record) + "\n")
    return max(0, size - len(real))


def percentiles(seconds: list[float]) -> dict:
    ms = np.array(seconds) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2)}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(name: str, queries_file: Path) -> dict:
    """In a fresh process: open the source, search, report latencies, recall and memory."""
    from gradfuse.sources.embedded import ANN_FILE, EmbeddedSource, build_ann_index
    from gradfuse.sources.base import current_version
    from gradfuse.embedding.encoder import load_encoder

    queries = json.loads(queries_file.read_text())
    encoder = load_encoder(ENCODER)
    for query in queries[:5]:  # warm the encoder
        encoder.encode_query(query)
    started = time.perf_counter()
    vectors_q = [encoder.encode_query(q) for q in queries]
    encode_ms = (time.perf_counter() - started) / len(queries) * 1000
    before = rss_mb()
    version = current_version(WORKSPACE / "sources" / name)
    source = EmbeddedSource(name, version, mode="bm25")
    opened = rss_mb()
    result = {"query_encoding_ms_mean": round(encode_ms, 2)}
    timings = []
    for query in queries:
        started = time.perf_counter()
        source.search(query, 10, mode="bm25")
        timings.append(time.perf_counter() - started)
    result["bm25"] = percentiles(timings)
    exact, timings = [], []
    for vector in vectors_q:
        started = time.perf_counter()
        _, scores = source.exact_search(vector, 10)
        timings.append(time.perf_counter() - started)
        exact.append(scores)
    result["dense_exact"] = percentiles(timings)
    result["rss_mb_after_exact"] = round(rss_mb() - before, 1)
    if source._ann is None:  # below the store's threshold: the same index, built here to compare
        started = time.perf_counter()
        source._ann = build_ann_index(source._vectors)
        result["ivf_build_s_in_process"] = round(time.perf_counter() - started, 1)
    else:
        result["ivf_on_disk_mb"] = round((version / ANN_FILE).stat().st_size / 2**20, 1)
    timings, recalls = [], []
    for vector, best in zip(vectors_q, exact):
        started = time.perf_counter()
        _, scores = source.approximate_search(vector, 10)
        timings.append(time.perf_counter() - started)
        hits = sum(score >= best[-1] - 1e-5 for score in scores)  # equal scores count as found
        recalls.append(min(hits, 10) / 10)
    result["dense_ivf"] = {**percentiles(timings), "recall@10": round(float(np.mean(recalls)), 4),
                           "nprobe": source._ann.nprobe, "lists": source._ann.nlist}
    result["rss_mb_open"] = round(opened - before, 1)
    result["rss_mb_total"] = round(rss_mb() - before, 1)
    return result


def scale_rows(data: Path, tmp: Path, results: ResultsFile) -> None:
    """Each size's row into `results` as it is measured (the encoding of the real passages in its header)."""
    from gradfuse.embedding.encoder import EmbeddingCache, embedding_text, load_encoder

    real = real_passages(data)
    queries_file = tmp / "queries.json"
    queries_file.write_text(json.dumps(real_queries(data)))
    cache = EmbeddingCache(WORKSPACE / "cache" / "embeddings.sqlite", load_encoder(ENCODER))
    started = time.perf_counter()
    cache.embed([embedding_text(p["title"], p["text"]) for p in real], progress=True)
    encoding = {"passages": len(real), "encoded_now": cache.last_computed,
                "seconds": round(time.perf_counter() - started, 1)}
    if cache.last_computed:
        encoding["passages_per_s"] = round(cache.last_computed / encoding["seconds"], 1)
    cache.close()
    results.header["encoding"] = encoding  # written with the first size's row
    for size in SIZES:
        name = f"scale-{size // 1000}k"
        corpus = tmp / f"{name}.jsonl"
        copies = write_corpus(corpus, real, size)
        started = time.perf_counter()
        report = build_source(WORKSPACE, SourceSpec(name, "jsonl", str(corpus)), encoder=ENCODER)
        build_s = time.perf_counter() - started
        version_dir = next((WORKSPACE / "sources" / name).glob("v-*"))
        disk = sum(f.stat().st_size for f in version_dir.rglob("*") if f.is_file()) / 2**20
        print(f"{name}: built in {build_s:.1f} s ({report.status}), measuring", flush=True)
        done = subprocess.run([sys.executable, __file__, "--measure", name, str(queries_file)], capture_output=True,
                              text=True)
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        row = {"passages": size, "real": size - copies, "copies": copies, "build_s": round(build_s, 1),
               "build_status": report.status, "disk_mb": round(disk, 1), **measured}
        results.add(name, row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(WORKSPACE / "sources" / name)  # 1M passages take gigabytes; the build is measured, not kept
        corpus.unlink()


def ray_throughput(data: Path, requests: int = 16) -> dict:
    """gro/query requests (n = 10, 128 tokens a passage) per second: this process, then 1 and 2 Ray replicas."""
    from gradfuse.execute import LOCAL
    from gradfuse.execute.ray_pool import RayExecutor
    from gradfuse.rerank import RerankSettings

    passages = [p["text"] for p in real_passages(data)[:10 * requests]]
    questions = real_queries(data)[:requests]
    work = [(q, passages[10 * i : 10 * i + 10]) for i, q in enumerate(questions)]
    settings = RerankSettings(target="query")

    def rate(executor) -> float:
        executor.score("gro", *work[0], settings)  # load the model before timing
        started = time.perf_counter()
        list(executor.map(lambda item: executor.score("gro", *item, settings), work))
        return requests / (time.perf_counter() - started)

    result = {"requests": requests, "method": "gro/query", "n": 10, "doc_tokens": 128,
              "local_2_threads_per_s": round(rate(LOCAL), 3)}
    temp = tempfile.mkdtemp(prefix="gfray", dir="/tmp")
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    ray_cli = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0",
                             "--include-dashboard=false", "--object-store-memory=200000000",
                             "--disable-usage-stats", f"--temp-dir={temp}", "--block"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([ray_cli, "status", f"--address=127.0.0.1:{port}"], env=env, capture_output=True,
                             cwd=temp).returncode and time.monotonic() < deadline:
            time.sleep(1)
        for replicas in (1, 2):
            executor = RayExecutor(f"127.0.0.1:{port}", replicas=replicas)
            result[f"ray_{replicas}_replica_per_s"] = round(rate(executor), 3)
            executor.close()
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:  # `ray start --block` does not always stop on SIGTERM
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)
    result["ratio_2_to_1"] = round(result["ray_2_replica_per_s"] / result["ray_1_replica_per_s"], 2)
    return result


def gpu_sizing(throughput: dict) -> dict:
    """Requests a second per GPU from the FLOP count: a forward and a backward pass cost about 6 x parameters
    FLOPs a token (2 forward, 4 backward), an upper bound for the reader gate (its documents only go forward)."""
    from gradfuse.lm.models import load_transformers

    _, model = load_transformers("smollm2")
    parameters = sum(p.numel() for p in model.parameters())
    tokens = 10 * 128 + 64  # ten passages of 128 tokens, the question and the target
    flops = 6 * parameters * tokens
    peak = 989e12  # H200 bf16 dense tensor-core peak (NVIDIA's datasheet)
    utilisation = 0.10  # assumed: a 135M model at batch 1 keeps a large GPU mostly idle
    per_gpu = peak * utilisation / flops
    return {"parameters": parameters, "tokens_per_request": tokens, "tflop_per_request": round(flops / 1e12, 3),
            "assumed_peak_tflops": peak / 1e12, "assumed_utilisation": utilisation,
            "requests_per_s_per_gpu": round(per_gpu, 1),
            "cpu_replica_requests_per_s": throughput["ray_1_replica_per_s"],
            "basis": "FLOP count and an assumed utilisation; no GPU machine was available to this benchmark"}


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = [r["passages"] for r in rows]
    for key, label in (("bm25", "BM25 (tantivy)"), ("dense_exact", "dense, exact (numpy)"),
                       ("dense_ivf", "dense, IVF (faiss)")):
        ax.plot(sizes, [r[key]["p50_ms"] for r in rows], marker="o", label=f"{label} p50")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("passages (beyond ~45k: copies of the real ones)")
    ax.set_ylabel("ms per query (query encoding excluded)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "retrieval_p50.png", dpi=110)
    plt.close(fig)


def markdown(results: ResultsFile) -> str:
    """The page, from what the results file holds so far: a run stopped half-way shows the sizes it measured (the
    Ray and GPU sections come at its end)."""
    s, sizes = results.header, list(results.rows.values())
    enc = s["encoding"]
    lines = [
        "# How cost grows with the corpus (`make bench-scale`)", "",
        results.provenance + (f" Wall time {s['wall_seconds'] / 60:.1f} min." if "wall_seconds" in s else ""), "",
        f"Passages: the {enc['passages']:,} passages of every shared corpus (real), shuffled; beyond them, **copies** "
        "of the same passages under new ids (columns *real* and *copies*). Queries: "
        f"{s['queries']} real queries drawn from the shared query files. Encoder {s['encoder']} (bf16); build times "
        "take the vectors from the embedding cache, so they do not include encoding: "
        + (f"encoding ran at {enc['passages_per_s']} passages/s here ({enc['encoded_now']:,} encoded in this run), "
           if enc.get("passages_per_s") else "every vector was cached in this run; ")
        + "about 90 passages/s on this CPU in bf16, so a fresh 1M-passage corpus adds about 3 hours of encoding "
          "on one such machine.", "",
        "| passages | real | copies | build s | disk MB | memory MB (open / after exact search) | BM25 p50 / p95 ms | "
        "exact dense p50 / p95 ms | IVF p50 / p95 ms | IVF recall@10 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sizes:
        lines.append(
            f"| {r['passages']:,} | {r['real']:,} | {r['copies']:,} | {r['build_s']} | {r['disk_mb']} | "
            f"{r['rss_mb_open']} / {r['rss_mb_after_exact']} | {r['bm25']['p50_ms']} / {r['bm25']['p95_ms']} | "
            f"{r['dense_exact']['p50_ms']} / {r['dense_exact']['p95_ms']} | "
            f"{r['dense_ivf']['p50_ms']} / {r['dense_ivf']['p95_ms']} | {r['dense_ivf']['recall@10']} |")
    lines += [
        "", "Latencies are one query at a time in one process, query encoding excluded (about "
        f"{sizes[0]['query_encoding_ms_mean']} ms a query with the encoder on this CPU). Memory is the resident "
        "growth of a fresh process that opens the store (the vectors are memory-mapped: exact search touches all of "
        "them). Build time is `gradfuse index`'s path: read, document store, tantivy, vectors from the cache, and "
        "at 200k passages and above the IVF index, which the store uses from there on (sources/embedded.py, "
        "`ANN_MIN_VECTORS`); below that the IVF column is the same index built in memory to compare.", "",
        "![retrieval p50](retrieval_p50.png)",
    ]
    if "ray" in s:
        lines += ray_sections(s["ray"], s["gpu_sizing"])
    return "\n".join(lines) + "\n"


def ray_sections(ray: dict, gpu: dict) -> list[str]:
    return [
        "", "## The scoring LM on Ray", "",
        f"{ray['requests']} `{ray['method']}` requests (n = {ray['n']}, {ray['doc_tokens']} tokens a passage) on a "
        "Ray head started here with 2 CPUs, replicas of one CPU each:", "",
        "| where | requests/s |", "|---|---:|",
        f"| this process (torch on 2 threads) | {ray['local_2_threads_per_s']} |",
        f"| Ray, 1 replica | {ray['ray_1_replica_per_s']} |",
        f"| Ray, 2 replicas | {ray['ray_2_replica_per_s']} |", "",
        f"Two replicas give {ray['ratio_2_to_1']}x the throughput of one on this 2-core machine. "
        + ("One process with torch on both cores is faster still: on a single machine, replicas pay for a model "
           "copy and a process each and share the same memory bandwidth, so Ray helps when it adds machines or "
           "GPUs, not cores of one CPU." if ray["local_2_threads_per_s"] > ray["ray_2_replica_per_s"] else
           "That is more than one process with torch on both cores."), "",
        "## Sizing a GPU cluster (not measured)", "",
        f"{gpu['basis']}. SmolLM2-135M has {gpu['parameters']:,} parameters; a `gro` request passes about "
        f"{gpu['tokens_per_request']:,} tokens forward and backward, about 6 x parameters x tokens = "
        f"{gpu['tflop_per_request']} TFLOP. At {gpu['assumed_utilisation']:.0%} of an H200's "
        f"{gpu['assumed_peak_tflops']:.0f} bf16 TFLOPS that is about {gpu['requests_per_s_per_gpu']} requests/s "
        f"per GPU replica, against {gpu['cpu_replica_requests_per_s']} for one CPU-core replica here. A service "
        "answering R gro requests/s needs about R / that many GPU replicas (`[server] ray_replicas`), plus the "
        "service process for retrieval and fusion, which scale with the sources, not the LM.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--measure", nargs=2, metavar=("SOURCE", "QUERIES"))
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--report", action="store_true", help="rewrite results.md from results.json")
    args = parser.parse_args()
    if args.report:
        payload = json.loads((OUT / "results.json").read_text())
        rows = payload.pop("rows")
        (OUT / "results.md").write_text(markdown(ResultsFile(OUT, payload, rows)))
        return
    if args.measure:
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]))))
        return
    command = "make bench-scale"
    if args.sizes:
        SIZES[:] = args.sizes
        command = "python bench/scale.py --sizes " + " ".join(map(str, args.sizes))
    started = time.perf_counter()
    results = ResultsFile.start(OUT, command, encoder=ENCODER, queries=QUERIES)
    data = load_benchmark(ROOT / "benchmarks" / "federated.toml").data
    with tempfile.TemporaryDirectory() as tmp:
        scale_rows(data, Path(tmp), results)
    ray = ray_throughput(data)
    print(json.dumps(ray), flush=True)
    results.header.update(ray=ray, gpu_sizing=gpu_sizing(ray), wall_seconds=round(time.perf_counter() - started, 1))
    plot(list(results.rows.values()))
    results.finish(markdown(results))
    print(f"results in {OUT / 'results.md'}")


if __name__ == "__main__":
    main()
