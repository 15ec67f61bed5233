"""A build's embedding on a Ray cluster against the same build in one process, on this machine: passages per second
and the hours 1,000,000 passages would take.

The corpus: the first `--passages` MS MARCO passages of TREC DL19's corpus (../shared/data), as a JSON-lines source,
built into a fresh workspace each row (its embedding cache empty, so every passage is embedded). Rows: the build in
this process (`gradfuse index`, the encoder's own threads on both cores), and `gradfuse index --ray` on a cluster
of one node and of two nodes started on loopback (`ray start`, one CPU each: one embedding task at a time per
node). Each is timed whole (reading, embedding, writing the index): what a user waits for. The projection divides
1,000,000 by the measured rate; on two cores the nodes share the same cores as the local build, so the two-node row
shows what Ray's scheduling costs or gains here, not what a second machine would add.

Run: make bench-ray-build (results/ray_build/).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "trec_dl19_passage" / "corpus.jsonl"
WORK = ROOT / ".gradfuse" / "bench" / "ray_build"
sys.path.insert(0, str(ROOT / "tests"))
from live_server import RAY_ENV, TwoNodeCluster  # noqa: E402  (the tests' helper)

from gradfuse.eval.record import ResultsFile  # noqa: E402

MILLION = 1_000_000


def build(corpus: Path, workspace: Path, *extra: str) -> dict:
    shutil.rmtree(workspace, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "gradfuse"), "index", "jsonl", str(corpus), "--source",
                           "passages", "--workspace", str(workspace), *extra], env=RAY_ENV, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    passages = sum(1 for _ in corpus.open())
    rate = passages / seconds
    return {"seconds": round(seconds, 1), "passages": passages, "passages_per_s": round(rate, 1),
            "hours_per_million": round(MILLION / rate / 3600, 2), "said": done.stdout.strip().splitlines()[0][:200]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "ray_build")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    corpus = WORK / "corpus.jsonl"
    with CORPUS.open() as source, corpus.open("w") as out:
        for number, line in enumerate(source):
            if number == args.passages:
                break
            out.write(json.dumps({"id": (row := json.loads(line))["id"], "text": row["text"]}) + "\n")
    results = ResultsFile.start(args.out, "make bench-ray-build", corpus="trec_dl19_passage (MS MARCO passages)",
                                passages=args.passages)
    results.add("this process", build(corpus, WORK / "local"))
    print(results.rows["this process"], flush=True)
    for nodes in (1, 2):
        cluster = TwoNodeCluster()
        try:
            cluster.start(nodes)
            name = f"Ray, {nodes} node(s) of 1 CPU"
            results.add(name, build(corpus, WORK / f"ray-{nodes}", "--ray", cluster.address))
            print(results.rows[name], flush=True)
        finally:
            cluster.stop()
    results.finish(markdown=markdown(results))


def markdown(results: ResultsFile) -> str:
    lines = ["# A build's embedding on a Ray cluster", "", results.provenance, "",
             f"{results.header['passages']} MS MARCO passages built from an empty embedding cache, timed whole; the "
             "projection is 1,000,000 passages at the measured rate. The nodes run on this machine's two cores "
             "(loopback), as the local build does: the rows compare the ways of running, not machines.", "",
             "| where | seconds | passages/s | hours for 1M passages |", "|---|---:|---:|---:|"]
    for name, row in results.rows.items():
        lines.append(f"| {name} | {row['seconds']:.1f} | {row['passages_per_s']:.1f} | {row['hours_per_million']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
