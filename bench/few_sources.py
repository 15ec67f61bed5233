"""At 4 to 32 sources nothing is routed: this checks that such a workspace is not slower or worse than before
routing existed (results/many_sources/few.md), and what routing would cost at 32.

The pooled corpus of bench/many_sources.py is split by topic into 4, 8 and 32 sources. The same test queries are
asked, warm, with the default method, by this checkout and by the commit before routing (BASE, checked out beside
it), each in its own process, twice in alternation (so that neither has the machine's warmer half). Reported: each
one's nDCG@10 with a paired randomisation test, and its p50/p90 latency.

Run: make bench-few-sources (after make bench-many-sources, whose passage vectors it reuses; about 5 min).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORK = Path(__file__).resolve().parents[1] / ".gradfuse" / "bench" / "many-sources"

BASE = "fda5698"  # the last commit before routing
SIZES = (4, 8, 32)
ROUNDS = 2


def measure(name: str, routed: bool) -> None:
    """In a process whose gradfuse is the checkout being measured (so it imports nothing else of this folder): the
    test queries, warm, then timed; `routed`: routed however few the sources (this checkout only)."""
    from gradfuse import Workspace
    from gradfuse.config import Config
    from gradfuse.eval.stats import per_query

    config = Config(workspace=WORK / name)
    if routed:
        from gradfuse.selection.routing import RoutingSettings

        config.routing = RoutingSettings(above=0)

    class Ranking:  # what per_query reads
        def __init__(self, ranking):
            self.ranking = ranking

    test = json.loads((WORK / "test-queries.json").read_text())
    with Workspace(config) as ws:
        for query in test:
            ws.search(query["text"])
        seconds, outcomes = [], {}
        for query in test:
            started = time.perf_counter()
            result = ws.search(query["text"])
            seconds.append(time.perf_counter() - started)
            outcomes[query["query_id"]] = Ranking([(c.doc_id, 0.0) for c in result.candidates])
    ids = [q["query_id"] for q in test]
    ndcg = per_query({q["query_id"]: q["relevant"] for q in test}, outcomes, ids, ["ndcg@10"])["ndcg@10"]
    print(json.dumps({"ndcg@10": [ndcg[q] for q in ids], "seconds": seconds}))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        measure(sys.argv[2], "--routed" in sys.argv)
        return 0
    from dataclasses import asdict

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from many_sources import DEV_SHARE, OUT, build, pooled_corpus, split, vectors_of

    from gradfuse.eval.record import ResultsFile
    from gradfuse.eval.stats import paired_p_value

    documents, queries = pooled_corpus()
    order = np.random.default_rng(1).permutation(len(queries))
    test = [asdict(queries[i]) for i in order[int(len(queries) * DEV_SHARE):]]
    (WORK / "test-queries.json").write_text(json.dumps(test))
    vectors = vectors_of(documents)
    base = WORK / "base-checkout"
    if not base.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(base), BASE], check=True, cwd=Path(__file__).parents[1])
    checkouts = {"before routing": base / "src", "this checkout": Path(__file__).resolve().parents[1] / "src"}
    results = ResultsFile.start(OUT, "make bench-few-sources", name="few", base=BASE, rounds=ROUNDS)
    for size in SIZES:
        build(documents, split(vectors, size, "topic"), "topic", size)
        ways = {label: (src, []) for label, src in checkouts.items()}
        if size > 24:  # beyond the budget: what routing would cost here
            ways["this checkout, routed"] = (checkouts["this checkout"], ["--routed"])
        runs = {label: [] for label in ways}
        for _ in range(ROUNDS):
            for label, (src, extra) in ways.items():
                env = {**os.environ, "PYTHONPATH": str(src)}
                out = subprocess.run([sys.executable, __file__, "--measure", f"topic{size}", *extra], env=env,
                                     check=True, capture_output=True, text=True).stdout
                runs[label].append(json.loads(out.strip().splitlines()[-1]))
        before = np.array(runs["before routing"][0]["ndcg@10"])
        for label, measured in runs.items():
            ndcg = np.array(measured[0]["ndcg@10"])
            row = {"sources": size, "code": label, "nDCG@10": float(ndcg.mean()),
                   "p (paired, against before)": paired_p_value(ndcg, before),
                   **{f"p50 ms, round {i + 1}": 1000 * float(np.percentile(m["seconds"], 50))
                      for i, m in enumerate(measured)},
                   **{f"p90 ms, round {i + 1}": 1000 * float(np.percentile(m["seconds"], 90))
                      for i, m in enumerate(measured)}}
            results.add(f"{size} sources, {label}", row)
            print(json.dumps(row), flush=True)
    results.finish(markdown(results))
    return 0


def markdown(results) -> str:
    """The page, from the rows the results file holds (a run stopped half-way: the sizes it finished)."""
    rows = list(results.rows.values())
    lines = ["# Few sources: not slower or worse than before routing", "",
             f"{results.provenance} Against {results.header['base']}; bench/few_sources.py's docstring says how. Each "
             "checkout in its own process, rounds alternating; 4, 8 and 32 sources are never routed (`[routing] above` "
             "is 32); the routed row asks 24 of the 32.", "",
             "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |"
              for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
