"""Indexing throughput on this CPU, on both CPU classes: documents and passages per CPU-second of a real build,
against the encoder's own forward rate.

For each CPU class (the CPU's own kernels, and an AVX2-only machine's: gradfuse.hardware.AVX2_ONLY) a worker
process measures, on SciFact abstracts from ../shared/data:
- the forward rate of each way to embed a passage: the ONNX copy in float32 (the default), torch in float32,
  torch in bf16; passages per CPU-second of the process, after a warm-up batch;
- a build of N abstracts into a fresh workspace (`Workspace.index`, a JSONL source) with the default encoder and
  with `@bfloat16`: documents and passages per CPU-second of the whole build (reading, BM25 index, vectors,
  SQLite), and that rate as a share of the same encoder's forward rate;
- `gradfuse demo` in a new folder with an empty GRADFUSE_CACHE (so the encoder's ONNX copy is exported first, as on
  a fresh install): wall seconds to its end and how long its four sources took to build.

ONNX Runtime picks its kernels from the CPU alone (no switch like ATEN_CPU_CAPABILITY), so its rows in the AVX2
class ran with this CPU's kernels; torch's rows there are an AVX2-only machine's.

    python bench/indexing.py [--documents 400]

Writes results/indexing/results.md and results.json (the JSON after each CPU class). Run alone: two busy cores make
every number smaller.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported in main only: the workers load nothing they do not measure
    from gradfuse.eval.record import ResultsFile

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "indexing"
DATA = Path(os.environ.get("GRADFUSE_DATA") or ROOT.parent / "shared" / "data")
CORPUS = DATA / "beir_scifact" / "corpus.jsonl"
FORWARD_PASSAGES = 128
ENCODERS = {"onnx float32 (default)": "all-MiniLM-L6-v2", "torch bf16": "all-MiniLM-L6-v2@bfloat16"}


def cpu_seconds() -> float:
    """CPU of this process and of the children it waited for (a files build parses in a worker)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def abstracts(count: int) -> list[dict]:
    records = []
    with open(CORPUS, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            records.append({"id": record.get("_id", record.get("id")), "title": record.get("title", ""), "text": record["text"]})
            if len(records) == count:
                break
    return records


def forward_rates(texts: list[str]) -> dict[str, float]:
    """Passages per CPU-second of each way to embed them, the model loaded and warmed up first."""
    from gradfuse.embedding.encoder import Encoder

    rates = {}
    onnx = Encoder("all-MiniLM-L6-v2@float32")
    torch32 = onnx._passage_model()  # sentence-transformers in float32 (also exports the copy if missing)
    bf16 = Encoder("all-MiniLM-L6-v2@bfloat16")
    ways = {"onnx float32 (default)": onnx.encode,
            "torch float32": lambda batch: torch32.encode(batch, batch_size=64, normalize_embeddings=True),
            "torch bf16": bf16.encode}
    for name, encode in ways.items():
        encode(texts[:8])
        started = cpu_seconds()
        encode(texts[8: 8 + FORWARD_PASSAGES])
        rates[name] = FORWARD_PASSAGES / (cpu_seconds() - started)
        print(f"  forward {name}: {rates[name]:.1f} passages/CPU-s", flush=True)
    return rates


def build_rates(records: list[dict], folder: Path) -> dict[str, dict]:
    from gradfuse import SourceSpec, Workspace
    from gradfuse.config import Config

    corpus = _write(folder / "scifact.jsonl", records)
    rows = {}
    for name, encoder in ENCODERS.items():
        ws = Workspace(Config(workspace=folder / f"ws-{len(rows)}", encoder=encoder))
        ws.index(SourceSpec("warm-up", "jsonl", str(_write(folder / "warm.jsonl", records[:4]))))  # model loaded
        started, wall = cpu_seconds(), time.perf_counter()
        report = ws.index(SourceSpec("scifact", "jsonl", str(corpus)))
        cpu, wall = cpu_seconds() - started, time.perf_counter() - wall
        rows[name] = {"documents": report.documents, "passages": report.embedded_now, "cpu_s": cpu, "wall_s": wall,
                      "documents_per_cpu_s": report.documents / cpu, "passages_per_cpu_s": report.embedded_now / cpu,
                      "encoder": report.encoder, "notes": report.notes}
        print(f"  build {name}: {rows[name]['passages_per_cpu_s']:.1f} passages/CPU-s", flush=True)
    return rows


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def demo(folder: Path, env: dict) -> dict:
    """`gradfuse demo` from nothing but the install: an empty encoder cache, a new folder."""
    env = {**env, "GRADFUSE_CACHE": str(folder / "cache"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    (folder / "run").mkdir()
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("gradfuse")), "demo"], cwd=folder / "run", env=env,
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"gradfuse demo failed: {done.stderr[-2000:]}")
    builds = [float(s) for s in re.findall(r"built \d+ documents in ([\d.]+) s", done.stdout)]
    return {"wall_s": wall, "builds_s": sum(builds), "sources": len(builds)}


def worker(documents: int) -> dict:
    from gradfuse.hardware import cpu_description
    from gradfuse.embedding.encoder import embedding_text

    records = abstracts(max(documents, FORWARD_PASSAGES + 8))
    texts = [embedding_text(r["title"], r["text"]) for r in records]
    result = {"machine": cpu_description(), "forward": forward_rates(texts)}
    with tempfile.TemporaryDirectory(prefix="gradfuse-indexing-") as folder:
        result["builds"] = build_rates(records[:documents], Path(folder))
    with tempfile.TemporaryDirectory(prefix="gradfuse-demo-") as folder:
        result["demo"] = demo(Path(folder), dict(os.environ))
    for name, row in result["builds"].items():
        row["share_of_forward"] = row["passages_per_cpu_s"] / result["forward"][name]
        row["share_of_onnx_forward"] = row["passages_per_cpu_s"] / result["forward"]["onnx float32 (default)"]
    return result


def report(results: ResultsFile) -> str:
    lines = [
        "# Indexing throughput on two cores, on both CPU classes",
        "",
        f"{results.provenance} {results.header['documents']} SciFact abstracts a build, {FORWARD_PASSAGES} for the "
        "forward rates.",
        "",
        "Forward rate: passages per CPU-second of the encoder alone. Build: documents and passages per CPU-second "
        "of `Workspace.index` on a JSONL source (reading, BM25 index, vectors, SQLite), and the build's passage "
        "rate as a share of its encoder's own forward rate (and of the ONNX copy's). Demo: `gradfuse demo` in a "
        "new folder with an empty encoder cache (the ONNX copy exported first, as on a fresh install), wall "
        "seconds to its end and for its four builds.",
        "",
    ]
    for kernels, label in (("native", "The CPU's own kernels"),
                           ("avx2", "An AVX2-only machine's kernels (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2; "
                                    "ONNX Runtime keeps this CPU's own, having no such switch)")):
        row = results.rows.get(kernels)
        if row is None:
            continue
        lines += [f"## {label}", "", f"CPU: {row['machine']}.", "",
                  "| encoder | forward, passages/CPU-s |", "|---|---:|"]
        lines += [f"| {name} | {rate:.1f} |" for name, rate in row["forward"].items()]
        lines += ["", "| build with | documents/CPU-s | passages/CPU-s | share of its forward rate | share of the "
                      "ONNX copy's | wall s |", "|---|---:|---:|---:|---:|---:|"]
        for name, build in row["builds"].items():
            lines.append(f"| {name} | {build['documents_per_cpu_s']:.1f} | {build['passages_per_cpu_s']:.1f} | "
                         f"{build['share_of_forward']:.0%} | {build['share_of_onnx_forward']:.0%} | "
                         f"{build['wall_s']:.1f} |")
        notes = sorted({note for build in row["builds"].values() for note in build["notes"]})
        lines += ["", *(f"Build note: {note}" for note in notes), "" if notes else None,
                  f"`gradfuse demo` from an empty cache: {row['demo']['wall_s']:.1f} s wall, its "
                  f"{row['demo']['sources']} sources built in {row['demo']['builds_s']:.1f} s.", ""]
    return "\n".join(line for line in lines if line is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=400, help="SciFact abstracts a build reads")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.documents)))
        return
    from gradfuse.eval.record import ResultsFile
    from gradfuse.hardware import AVX2_ONLY

    results = ResultsFile.start(OUT, " ".join(["python bench/indexing.py", *sys.argv[1:]]), documents=args.documents,
                                forward_passages=FORWARD_PASSAGES, encoders=ENCODERS)
    for kernels, caps in (("native", {}), ("avx2", AVX2_ONLY)):
        print(kernels, flush=True)
        done = subprocess.run([sys.executable, __file__, "--worker", "--documents", str(args.documents)],
                              env={**os.environ, **caps, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                              timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"the {kernels} worker failed: {done.stderr[-3000:]}")
        results.add(kernels, json.loads(done.stdout.strip().splitlines()[-1]))
    page = report(results)
    results.finish(page)
    print(page)


if __name__ == "__main__":
    main()
