"""Routing before retrieval at 100 and 1,000 sources (results/many_sources/).

Six shared corpora (TREC DL19 passages, SciFact, DBpedia-entity sample, Cranfield, HotpotQA, PubMedQA; 33k
passages) are pooled and split into N sources two ways, as federated-search testbeds are built: by topic (k-means
over the passage vectors, so a source is a knowledge base on one subject) and at random (every source holds every
subject: the case routing cannot help, reported beside it). One source in ten is served by a second `gradfuse serve`
and asked through a `kind = "gradfuse"` source. The queries are a seeded sample of each corpus's judged queries,
split into dev (the routing budget is chosen there) and test (reported).

Each configuration is asked the test queries warm (every query once before the timed pass) with the default
method, by three ways of choosing the sources: asking every source (routing off, every source held open), routing
by the sources' summaries (the default), and ReDDE, a sample-based resource-selection baseline, at the same
budget, and by the adaptive rule (the default budget, widened to every source whose summary score is within a
margin of the best, up to `widen_max`; the margin chosen on dev over all four configurations at once). Reported:
nDCG@10 with a paired randomisation test against asking every source, the share of relevant
passages whose source was asked, sources asked per question, p50/p90 latency, the process's memory and open files.

Run: make bench-many-sources (about 40 min on 2 cores; the passage vectors are computed once and kept in
.gradfuse/bench/many-sources/cache).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from live_server import gradfuse_serve  # noqa: E402  (the tests' helper)

from gradfuse import Workspace  # noqa: E402
from gradfuse.config import load_config  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.eval.stats import paired_difference, per_query  # noqa: E402
from gradfuse.selection.routing import RoutingSettings  # noqa: E402
from gradfuse.embedding.encoder import EmbeddingCache, embedding_text, load_encoder  # noqa: E402

DATA = Path(os.environ.get("GRADFUSE_DATA") or ROOT.parent / "shared" / "data")
CORPORA = {"dl19": "trec_dl19_passage", "scifact": "beir_scifact", "dbpedia": "beir_dbpedia_entity_sample",
           "cranfield": "classic_cranfield", "hotpotqa": "hotpotqa_train100_hipporag", "pubmedqa": "pubmedqa_pqal"}
# The two larger corpora are cut to a seeded subset that holds every passage judged relevant, so that the vectors
# take minutes, not half an hour, on 2 cores (16k passages in all).
MAX_PASSAGES = {"dl19": 6000, "scifact": 2000}
QUERIES_PER_CORPUS = 25
DEV_SHARE = 1 / 3
SIZES = (100, 1000)
SPLITS = ("topic", "random")
REMOTE_EVERY = 10  # one source in ten is behind the second gradfuse
BUDGETS = (8, 16, 24, 32, 48)  # tried on dev
MARGINS = (0.1, 0.2, 0.25, 0.3, 0.4)  # [routing] widen_margin, tried on dev with the default budget and widen_max
GAPS_AT = (8, 24, 50)  # how far below the best score the k-th source scores (the flatness the margin reads)
BOUNDED = 128  # max_open of the row that shows what holding fewer sources open costs
WORK = ROOT / ".gradfuse" / "bench" / "many-sources"
OUT = ROOT / "results" / "many_sources"
MARGIN_CHOSEN = "widen margin chosen on dev"


@dataclass
class Query:
    query_id: str
    text: str
    corpus: str
    relevant: dict[str, int]  # pooled doc id → grade


@dataclass
class Ranking:  # what eval.stats.per_query reads
    ranking: list[tuple[str, float]]


def pooled_corpus() -> tuple[list[dict], list[Query]]:
    documents, queries = [], []
    rng = np.random.default_rng(0)
    for short, folder in CORPORA.items():
        rows = [json.loads(line) for line in open(DATA / folder / "corpus.jsonl")]
        judged: dict[str, dict[str, int]] = {}
        for line in open(DATA / folder / "qrels.tsv"):
            query_id, doc_id, grade = line.rstrip("\n").split("\t")
            if int(grade) > 0:
                judged.setdefault(query_id, {})[doc_id] = int(grade)
        if short in MAX_PASSAGES:
            relevant = {d for grades in judged.values() for d in grades}
            rest = [i for i, r in enumerate(rows) if str(r["id"]) not in relevant]
            fill = set(rng.permutation(rest)[: max(0, MAX_PASSAGES[short] - (len(rows) - len(rest)))].tolist())
            rows = [r for i, r in enumerate(rows) if str(r["id"]) in relevant or i in fill]
        ids = {str(r["id"]) for r in rows}
        documents += [{"id": f"{short}-{r['id']}", "title": r.get("title") or "", "text": r["text"]} for r in rows]
        judged = {q: {f"{short}-{d}": g for d, g in grades.items() if d in ids} for q, grades in judged.items()}
        judged = {q: grades for q, grades in judged.items() if grades}
        texts = {str(r["id"]): r["text"] for r in map(json.loads, open(DATA / folder / "queries.jsonl"))}
        usable = sorted(q for q in judged if q in texts)
        for query_id in rng.permutation(usable)[:QUERIES_PER_CORPUS]:
            queries.append(Query(f"{short}-{query_id}", texts[query_id], short, judged[query_id]))
    return documents, queries


def vectors_of(documents: list[dict]) -> np.ndarray:
    (WORK / "cache").mkdir(parents=True, exist_ok=True)
    cache = EmbeddingCache(WORK / "cache" / "embeddings.sqlite", load_encoder("all-MiniLM-L6-v2"))
    try:
        return cache.embed([embedding_text(d["title"], d["text"]) for d in documents], progress=True)
    finally:
        cache.close()


def split(vectors: np.ndarray, size: int, how: str) -> np.ndarray:
    """Each passage's source number."""
    if how == "random":
        return np.random.default_rng(0).permutation(len(vectors)) % size
    import faiss

    kmeans = faiss.Kmeans(vectors.shape[1], size, niter=20, seed=0, spherical=True)
    kmeans.train(np.ascontiguousarray(vectors, dtype=np.float32))
    return kmeans.index.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)[1][:, 0]


def source_name(how: str, size: int, number: int) -> str:
    return f"{how}{size}-{number:04d}"


def build(documents: list[dict], owners: np.ndarray, how: str, size: int) -> tuple[Path, Path, list[str]]:
    """The local and the remote workspace of one configuration (the remote's sources are every REMOTE_EVERY-th),
    each built by one `gradfuse index each` over a folder of JSONL files."""
    name = f"{how}{size}"
    local_in, remote_in = WORK / "inputs" / name / "local", WORK / "inputs" / name / "remote"
    for folder in (local_in, remote_in):
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.jsonl"):  # written again below: a source's passages are this split's
            stale.unlink()
    names = []
    for number in range(size):
        rows = [documents[i] for i in np.flatnonzero(owners == number)]
        if not rows:
            continue
        source = source_name(how, size, number)
        names.append(source)
        target = (remote_in if number % REMOTE_EVERY == REMOTE_EVERY - 1 else local_in) / f"{source}.jsonl"
        target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for workspace, folder in ((WORK / name, local_in), (WORK / "remote", remote_in)):
        if not any(folder.iterdir()):  # a few sources: none behind the remote
            continue
        cache = workspace / "cache" / "embeddings.sqlite"
        if not cache.exists():  # the vectors computed once, shared
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.symlink_to(WORK / "cache" / "embeddings.sqlite")
        started = time.perf_counter()
        _gradfuse("index", "each", "jsonl", str(folder), "--workspace", str(workspace))
        print(f"{name}: built {folder.name} sources in {time.perf_counter() - started:.0f} s", flush=True)
    return WORK / name, remote_in, names


def _gradfuse(*args: str) -> None:
    subprocess.run([str(Path(sys.executable).parent / "gradfuse"), *args], check=True, stdout=subprocess.DEVNULL)


def open_configuration(workspace: Path, remote_in: Path, url: str) -> Workspace:
    """The workspace with its remote sources declared (each one of the second gradfuse's sources)."""
    lines = [f'workspace = "{workspace.name}"']
    for file in sorted(remote_in.glob("*.jsonl")):
        lines += [f"[sources.{file.stem}]", 'kind = "gradfuse"', f'url = "{url}"', f'sources = ["{file.stem}"]']
    config_file = workspace.parent / f"{workspace.name}.toml"
    config_file.write_text("\n".join(lines) + "\n")
    return Workspace(load_config(config_file))


def run(ws: Workspace, queries: list[Query], routing: RoutingSettings, owner_of: dict[str, str], *,
        timed: bool = True) -> dict:
    ws.config.routing = routing
    ws.catalog.trim()  # down to this run's max_open
    for query in queries if timed else []:  # warm: sources opened, candidate vectors cached
        ws.search(query.text)
    seconds, asked, outcomes, recall, failed = [], [], {}, [], []
    for query in queries:
        started = time.perf_counter()
        result = ws.search(query.text)
        seconds.append(time.perf_counter() - started)
        called = set(result.routing.asked if result.routing else result.ranked_lists) | \
            {f.source for f in result.failures}
        asked.append(len(called))
        failed.append(len(result.failures))
        outcomes[query.query_id] = Ranking([(_doc_key(c), c.scores.get("prior", c.native_score) or 0.0)
                                            for c in result.candidates])
        recall.append(np.mean([owner_of[d] in called for d in query.relevant]))
        if result.failures:
            print(f"  {query.query_id}: {len(result.failures)} failed, first {result.failures[0].detail}", flush=True)
    qrels = {q.query_id: q.relevant for q in queries}
    ndcg = per_query(qrels, outcomes, [q.query_id for q in queries], ["ndcg@10"])["ndcg@10"]
    return {"ndcg@10": [ndcg[q.query_id] for q in queries], "source_recall": recall, "asked": asked, "failed": failed,
            "seconds": seconds, "rss_mb": _rss_mb(), "open_files": len(os.listdir("/proc/self/fd")),
            "open_sources": len(ws.catalog._sources)}


def _doc_key(candidate) -> str:
    # a remote's passage is `<its source>/<doc id>` here (its source has the same name there)
    return candidate.doc_id.removeprefix(candidate.source + "/")


def _rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def summary_row(name: str, way: str, measured: dict, reference: dict | None) -> dict:
    ndcg = np.array(measured["ndcg@10"])
    row = {"configuration": name, "sources asked by": way, "nDCG@10": float(ndcg.mean()),
           "source recall": float(np.mean(measured["source_recall"])),
           "sources asked": float(np.mean(measured["asked"])), "failed": float(np.mean(measured["failed"])),
           "p50 ms": 1000 * float(np.percentile(measured["seconds"], 50)),
           "p90 ms": 1000 * float(np.percentile(measured["seconds"], 90)),
           "RSS MB": measured["rss_mb"], "open files": measured["open_files"],
           "sources open": measured["open_sources"]}
    if reference is not None:
        against_all = paired_difference(ndcg, reference["ndcg@10"])
        row["delta vs all"], row["p (paired)"] = against_all["delta"], against_all["p"]
        row["calls saved"] = 1 - float(np.mean(measured["asked"]) / np.mean(reference["asked"]))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--splits", nargs="+", default=list(SPLITS))
    parser.add_argument("--configuration", help=argparse.SUPPRESS)  # one configuration, in its own process
    parser.add_argument("--remote", help=argparse.SUPPRESS)
    args = parser.parse_args()
    documents, queries = pooled_corpus()
    order = np.random.default_rng(1).permutation(len(queries))
    dev = [queries[i] for i in order[: int(len(queries) * DEV_SHARE)]]
    test = [queries[i] for i in order[int(len(queries) * DEV_SHARE):]]
    if args.configuration:
        measure(args.configuration, args.remote, dev, test)
        return 0
    command = "python bench/many_sources.py " + " ".join(sys.argv[1:]) if sys.argv[1:] else "make bench-many-sources"
    results = ResultsFile.start(OUT, command, **{
        "routing defaults": vars(RoutingSettings()), "dev queries": len(dev), "test queries": len(test),
        "queries per corpus": QUERIES_PER_CORPUS, "open files limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]})
    print(f"{len(documents)} passages, {len(dev)} dev and {len(test)} test queries", flush=True)
    vectors = vectors_of(documents)
    names = []
    for how in args.splits:
        for size in args.sizes:
            owners = split(vectors, size, how)
            build(documents, owners, how, size)
            owner_of = {d["id"]: source_name(how, size, int(o)) for d, o in zip(documents, owners)}
            (WORK / f"{how}{size}-owners.json").write_text(json.dumps(owner_of))
            names.append(f"{how}{size}")
    # The second gradfuse takes up to 100 connections at once from this one (one a source asked, when every source
    # is asked): above its default of 32 from one address, as its operator would set it for a known peer.
    (WORK / "remote.toml").write_text('workspace = "remote"\n[server]\nmax_client_connections = 256\n')
    with gradfuse_serve(WORK / "remote", "--config", str(WORK / "remote.toml"), log=WORK / "remote.log") as url:
        for name in names:  # each in a process of its own, so that its memory is its own
            subprocess.run([sys.executable, __file__, "--configuration", name, "--remote", url], check=True)
            measured = json.loads((WORK / f"{name}.json").read_text())
            results.add(name, {"summary": measured["rows"], "dev nDCG@10 by budget": measured["tuning"],
                               "per query": measured["raw"]})
    margin = chosen_margin({name: row["dev nDCG@10 by budget"] for name, row in results.rows.items()})
    for row in (row for configuration in results.rows.values() for row in configuration["summary"]):
        if row["sources asked by"] == widened_way(margin):
            row["sources asked by"] += " (dev's choice)"
    results.header[MARGIN_CHOSEN] = margin
    results.finish(markdown(results))
    return 0


def measure(name: str, url: str, dev: list[Query], test: list[Query]) -> None:
    owner_of = json.loads((WORK / f"{name}-owners.json").read_text())
    remote_in = WORK / "inputs" / name / "remote"
    rows, tuning, raw = [], {}, {}
    with open_configuration(WORK / name, remote_in, url) as ws:
        count = len(ws.source_names())
        ws.catalog.summaries.make(ws.source_names())  # the remote sources' summaries, ahead of the questions
        every = RoutingSettings(above=100_000, max_open=count + 10)
        ws.config.routing = every
        first = ws.search("which sources answer")  # every source opened once (cold, they time out at 1,000)
        print(f"{name}: first question to every source: {len(first.failures)} of {count} failed", flush=True)
        # dev: the smallest budget whose nDCG@10 is within 0.005 of asking every source
        tuning["all"] = float(np.mean(run(ws, dev, every, owner_of, timed=False)["ndcg@10"]))
        for budget in BUDGETS:
            tuning[budget] = float(np.mean(run(ws, dev, RoutingSettings(budget=budget), owner_of,
                                               timed=False)["ndcg@10"]))
        budget = next((b for b in BUDGETS if tuning[b] >= tuning["all"] - 0.005), BUDGETS[-1])
        tuning["chosen"] = budget
        for margin in MARGINS:
            dev_run = run(ws, dev, RoutingSettings(widen_margin=margin), owner_of, timed=False)
            tuning[f"widen {margin}"] = float(np.mean(dev_run["ndcg@10"]))
            tuning[f"widen {margin} asked"] = float(np.mean(dev_run["asked"]))
        tuning |= score_gaps(ws, dev)
        print(name, "dev", tuning, flush=True)
        reference = run(ws, test, every, owner_of)
        rows.append(summary_row(name, "every source", reference, None))
        raw["all"] = reference
        for routed in BUDGETS:  # the curve; the budget itself was chosen on dev
            measured = run(ws, test, RoutingSettings(budget=routed), owner_of)
            chosen = " (dev's choice)" if routed == budget else ""
            rows.append(summary_row(name, f"routing: summary, budget {routed}{chosen}", measured, reference))
            raw[f"summary-{routed}"] = measured
        for margin in MARGINS:
            measured = run(ws, test, RoutingSettings(widen_margin=margin), owner_of)
            rows.append(summary_row(name, widened_way(margin), measured, reference))
            raw[f"summary-widen-{margin}"] = measured
        measured = run(ws, test, RoutingSettings(router="redde", budget=budget), owner_of)
        rows.append(summary_row(name, f"routing: redde, budget {budget}", measured, reference))
        raw[f"redde-{budget}"] = measured
        bounded = RoutingSettings(budget=budget, max_open=BOUNDED)
        measured = run(ws, test, bounded, owner_of)
        rows.append(summary_row(name, f"routing: summary, budget {budget}, max_open {BOUNDED}", measured, reference))
        raw[f"summary-{budget}-open-{BOUNDED}"] = measured
        for row in rows:
            print(json.dumps(row), flush=True)
    (WORK / f"{name}.json").write_text(json.dumps({"rows": rows, "tuning": tuning, "raw": raw}))


def widened_way(margin: float) -> str:
    defaults = RoutingSettings()
    return f"routing: summary, budget {defaults.budget} widened within {margin} of the best (≤ {defaults.widen_max})"


def score_gaps(ws: Workspace, queries: list[Query]) -> dict:
    """Median over `queries` of how far the k-th best summary score stands below the best."""
    names = ws.source_names()
    scores = [sorted(ws.query.route(q.text, names).scores.values(), reverse=True) for q in queries]
    return {f"gap to source {k}": float(np.median([s[0] - s[min(k, len(s)) - 1] for s in scores])) for k in GAPS_AT}


def chosen_margin(tuning: dict) -> float:
    """The smallest margin whose dev nDCG@10 comes within 0.005 of the widest margin's in every configuration."""
    widest = MARGINS[-1]
    return next(m for m in MARGINS if all(t[f"widen {m}"] >= t[f"widen {widest}"] - 0.005 for t in tuning.values()))


def markdown(results: ResultsFile) -> str:
    """The page, from what the results file holds so far: a run stopped half-way shows the configurations it
    finished (the widen margin is chosen at its end, over all of them)."""
    header = results.header
    rows = [row for configuration in results.rows.values() for row in configuration["summary"]]
    columns = list(rows[0])
    for row in rows:
        columns += [c for c in row if c not in columns]
    lines = ["# Routing before retrieval at 100 and 1,000 sources", "",
             f"{results.provenance} bench/many_sources.py's docstring says how. {header['test queries']} test queries "
             f"({header['dev queries']} dev), routing defaults {header['routing defaults']}.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    lines += ["", "Dev nDCG@10 by routing budget (summary router; `all`: every source asked), by widen margin "
              "(`widen m`, and the sources it asked), and the median gap from the best summary score to the k-th"
              + (f"; the margin chosen on dev for every configuration at once: {header[MARGIN_CHOSEN]}"
                 if MARGIN_CHOSEN in header else ""), ""]
    for name, configuration in results.rows.items():
        tuning = configuration["dev nDCG@10 by budget"]
        lines.append(f"- {name}: " + ", ".join(f"{k}: {v:.3f}" for k, v in tuning.items()))
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


if __name__ == "__main__":
    raise SystemExit(main())
