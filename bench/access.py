"""What permissions cost a question, over the federated benchmark's nine sources (results/access/).

The same documents are built twice into one workspace: once as they are ("open": no source reads who may see a
document) and once with a seeded half of each corpus restricted (40% open, 50% for group `team-b`, 10% for group
`team-a`, read from a field named by `readers_field`). A question is then asked, over all nine sources, in four ways,
in turn for every question, each way first as often as the others, so that neither drift on a shared machine nor
what the first asker leaves ready (the query's vector, the index pages) favours one:

- off: the open sources, as a workspace without permissions asks them;
- on, every document: the restricted sources by a key that reads every document (the filter is not applied);
- on, team-b: the restricted sources by a key in group team-b (reads 90% of the documents);
- on, team-a: the restricted sources by a key in group team-a (reads 50%).

Each by the library (`Workspace.search`, rrf over every source's list) with BM25 in every source (the federated
benchmark's retrieval) and with hybrid retrieval (the workspace default: BM25 and the masked vector matrix), and
over HTTP: /search on a server without keys against one whose key file maps a key to team-a. Every question is
asked once a way (no cache hit); the first questions warm each way up (the readers masks are built on first use and
kept). Reported: p50/p90 wall ms and each "on" p50's change against "off". Criterion (issue 43): at most +10% p50.

The passage vectors come from .gradfuse/bench/many-sources/cache when that benchmark ran (six of the nine corpora);
the others are computed once into .gradfuse/bench/access/cache. The derived corpora live in
.gradfuse/bench/access/corpora (never in the repository).

    python bench/access.py [--queries 500] [--warm 10]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from live_server import serving  # noqa: E402  (the tests' helper: uvicorn in a thread)

from gradfuse import Workspace  # noqa: E402
from gradfuse.access import EVERYTHING, Principal  # noqa: E402
from gradfuse.access.keys import AccessSettings, PrincipalSettings, key_hash  # noqa: E402
from gradfuse.config import Config  # noqa: E402
from gradfuse.eval.benchmark import load_benchmark  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.eval.runner import queries_and_qrels  # noqa: E402
from gradfuse.server.app import create_app  # noqa: E402
from gradfuse.sources.base import SourceSpec  # noqa: E402

OUT = ROOT / "results" / "access"
WORK = ROOT / ".gradfuse" / "bench" / "access"
SHARED_VECTORS = ROOT / ".gradfuse" / "bench" / "many-sources" / "cache" / "embeddings.sqlite"
FIELD = "audience"  # the derived corpora's readers field: read only by the restricted sources
KEY = "bench-access-team-a-key"
PRINCIPALS = {
    "on, every document": Principal("auditor", every_document=True),
    "on, team-b (reads 90%)": Principal("bob", frozenset({"team-b"})),
    "on, team-a (reads 50%)": Principal("alice", frozenset({"team-a"})),
}


def audience(doc_id: str) -> list[str] | None:
    """Who may read a document: a seeded, stable draw from its id (40% open, 50% team-b, 10% team-a)."""
    slot = int.from_bytes(hashlib.sha256(f"access-bench/{doc_id}".encode()).digest()[:4], "big") % 10
    return None if slot < 4 else ["team-b"] if slot < 9 else ["team-a"]


def derived_corpus(folder: Path) -> Path:
    """The BEIR folder's corpus with an `audience` field on the restricted documents, written once."""
    target = WORK / "corpora" / folder.name
    if not (target / "corpus.jsonl").exists():
        target.mkdir(parents=True, exist_ok=True)
        with (folder / "corpus.jsonl").open() as src, (target / "corpus.tmp").open("w") as out:
            for line in src:
                record = json.loads(line)
                readers = audience(str(record.get("id", record.get("_id"))))
                if readers:
                    record[FIELD] = readers
                out.write(json.dumps(record) + "\n")
        (target / "corpus.tmp").rename(target / "corpus.jsonl")
    return target


def build(ws: Workspace, bench) -> tuple[list[str], list[str], dict]:
    """The open and the restricted copy of every source; their names and what the builds reported."""
    opened, restricted, builds = [], [], {}
    for name, spec in bench.sources.items():
        corpus = str(derived_corpus(Path(spec.path)))
        for built, options in ((name, spec.options), (f"r-{name}", {**spec.options, "readers_field": FIELD})):
            report = ws.index(SourceSpec(built, "beir", corpus, options), progress=True)
            builds[built] = {"documents": report.documents, "embedded_now": report.embedded_now}
        opened.append(name)
        restricted.append(f"r-{name}")
    return opened, restricted, builds


def rotated(ways: dict, position: int) -> list[tuple]:
    """The ways in turn, each first as often as the others: the first to ask a question pays for what the others
    then find ready (its query vector, the index pages its words lead to)."""
    items = list(ways.items())
    turn = position % len(items)
    return items[turn:] + items[:turn]


def percentiles(values: list[float]) -> dict:
    return {"p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)), "n": len(values)}


def library_row(ws: Workspace, questions: list[str], warm: int, names: dict[str, list[str]], retrieval: str) -> dict:
    """`Workspace.search` (rrf) with `retrieval` in every source, without permissions and by each principal."""
    ways = {"off": (names["open"], EVERYTHING)} | {w: (names["restricted"], p) for w, p in PRINCIPALS.items()}
    seconds = {way: [] for way in ways}
    for position, question in enumerate(questions):
        for way, (sources, principal) in rotated(ways, position):
            started = time.perf_counter()
            result = ws.search(question, method="rrf", k=10, sources=sources, retrieval=retrieval,
                               principal=principal)
            elapsed = time.perf_counter() - started
            if result.failures:
                raise RuntimeError(f"{way}: {[f.detail for f in result.failures]}")
            if position >= warm:
                seconds[way].append(elapsed * 1000)
    row = compared(seconds)
    print(retrieval, {w: round(r["p50"], 1) for w, r in row.items()}, flush=True)
    return row


def server_row(config: Config, questions: list[str], warm: int, names: dict[str, list[str]]) -> dict:
    """/search (rrf, BM25) over HTTP: a server without keys against one with a key file's team-a key."""
    keyed = replace(config, access=AccessSettings(principals={"alice": PrincipalSettings(
        sources=("*",), groups=("team-a",), key_sha256=key_hash(KEY.encode()))}))
    seconds = {"off": [], "on, team-a (reads 50%)": []}
    with Workspace(config) as plain, Workspace(keyed) as guarded:
        with serving(create_app(plain)) as off_url, serving(create_app(guarded)) as on_url:
            ways = {"off": (off_url, names["open"], {}),
                    "on, team-a (reads 50%)": (on_url, names["restricted"], {"X-API-Key": KEY})}
            with httpx.Client(timeout=300) as client:
                for position, question in enumerate(questions):
                    for way, (url, sources, headers) in rotated(ways, position):
                        body = {"query": question, "method": "rrf", "k": 10, "sources": sources,
                                "retrieval": "bm25"}
                        started = time.perf_counter()
                        reply = client.post(url + "/search", json=body, headers=headers)
                        elapsed = time.perf_counter() - started
                        reply.raise_for_status()
                        if reply.headers.get("x-gradfuse-cache") == "hit":
                            raise RuntimeError("a question was answered from the cache")
                        if position >= warm:
                            seconds[way].append(elapsed * 1000)
    row = compared(seconds)
    print("server", {w: round(r["p50"], 1) for w, r in row.items()}, flush=True)
    return row


def compared(milliseconds: dict[str, list[float]]) -> dict:
    """Each way's percentiles and, against "off" over the same questions, its p50's change with a 95% bootstrap
    interval (questions resampled) and the median of each question's own change."""
    off = np.array(milliseconds["off"])
    rows, draws = {}, np.random.default_rng(0).integers(0, len(off), size=(2000, len(off)))
    for way, values in milliseconds.items():
        rows[way] = percentiles(values)
        if way != "off":
            on = np.array(values)
            resampled = np.median(on[draws], axis=1) / np.median(off[draws], axis=1) - 1
            rows[way].update(change=float(np.median(on) / np.median(off) - 1),
                             interval=[float(v) for v in np.percentile(resampled, [2.5, 97.5])],
                             paired=float(np.median(on / off - 1)))
    return rows


def markdown(results: ResultsFile) -> str:
    header = results.header
    lines = [
        "# What permissions cost a question (issue 43)", "",
        f"{results.provenance} {header['measured']} test questions of the federated benchmark "
        "(seeded, mixed from its eight query sets), each asked once in every way, in turn, each way first as often as "
        f"the others; the first {header['warm']} warm each way up and are not counted.", "",
        "The nine sources of benchmarks/federated.toml, built twice from the same documents: open, and with 60% of "
        "each corpus restricted (50% to group team-b, 10% to team-a; 40% left open), filtered inside each source "
        "before ranking. rrf over every source's list, k = 10, 100 candidates from each source.", "",
        "| path | retrieval | way | p50 ms | p90 ms | p50 against off | 95% interval | median of each question's |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, rows in results.rows.items():
        path, retrieval = name.split("|")
        for way, row in rows.items():
            against = (f"{row['change']:+.1%} | {row['interval'][0]:+.1%} to {row['interval'][1]:+.1%} | "
                       f"{row['paired']:+.1%}") if "change" in row else " | | "
            lines.append(f"| {path} | {retrieval} | {way} | {row['p50']:.1f} | {row['p90']:.1f} | {against} |")
    worst = max(row["change"] for rows in results.rows.values() for row in rows.values() if "change" in row)
    lines += ["", f"Largest p50 change against off: {worst:+.1%} (criterion: at most +10%: "
              f"{'met' if worst <= 0.10 else 'not met'}). The interval is the p50 change's over questions drawn "
              "again (2,000 draws); \"each question's\" is the median of every question's own change, which the "
              "questions' spread moves least."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--warm", type=int, default=10)
    args = parser.parse_args()
    bench = load_benchmark(ROOT / "benchmarks" / "federated.toml")
    config = Config(workspace=WORK / "workspace", depth=100, k=10, encoder=bench.encoder)
    cache = config.workspace / "cache" / "embeddings.sqlite"
    if not cache.exists() and SHARED_VECTORS.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED_VECTORS, cache)  # a copy: this benchmark adds three corpora's vectors of its own
    with Workspace(config) as ws:
        opened, restricted, builds = build(ws, bench)
        names = {"open": opened, "restricted": restricted}
        queries, _, _ = queries_and_qrels(bench)
        test = sorted((q for q in queries if q.split == "test"), key=lambda q: q.query_id)
        questions = [q.text for q in random.Random(0).sample(test, min(args.queries, len(test)))]
        results = ResultsFile.start(OUT, f"python bench/access.py --queries {args.queries} --warm {args.warm}",
                                    queries=args.queries, warm=args.warm, measured=len(questions) - args.warm,
                                    builds=builds)
        for retrieval in ("bm25", "hybrid"):  # a row is a path and retrieval: "path|retrieval"
            results.add(f"library|{retrieval}", library_row(ws, questions, args.warm, names, retrieval))
    results.add("HTTP /search|bm25", server_row(config, questions, args.warm, names))
    results.finish(markdown(results))
    print((OUT / "results.md").read_text())


if __name__ == "__main__":
    main()
