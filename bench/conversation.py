"""A follow-up asked alone against the conversation made into one question (gradfuse.conversation), over the
federated benchmark's nine sources.

Run: make bench-conversation (after the federated benchmark's sources are built, e.g. by make bench-federated or
make bench-engines). The cases (bench/conversation_cases.json) were written here from HotpotQA questions: a first
turn that names the entity, a follow-up that only refers to it ("When was he born?"); a case's relevant documents
are its HotpotQA question's qrels. Retrieval with the server's defaults (method select, hybrid retrieval).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from gradfuse import Workspace
from gradfuse.config import Config
from gradfuse.conversation import question_of
from gradfuse.eval.benchmark import load_benchmark
from gradfuse.eval.record import ResultsFile

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "bench" / "conversation_cases.json"
OUT = ROOT / "results" / "conversation"
K = 5
MAX_CHARS = 8000  # the server's max_query_chars
LABELS = ("last turn alone", "joined turns")


def main() -> None:
    bench = load_benchmark(ROOT / "benchmarks" / "federated.toml")
    ws = Workspace(Config(workspace=bench.workspace))
    relevant: dict[str, set[str]] = {}
    for line in (bench.query_sets["hotpotqa"].path / "qrels.tsv").read_text().splitlines():
        query_id, doc_id, grade = line.split("\t")
        if int(grade) > 0:
            relevant.setdefault(query_id, set()).add(f"hotpotqa/{doc_id}")
    results = ResultsFile.start(OUT, "make bench-conversation", k=K)
    for case in json.loads(CASES.read_text()):
        asked = {"last turn alone": case["turns"][-1],
                 "joined turns": question_of([("user", t) for t in case["turns"]], MAX_CHARS)}
        row = {"turns": case["turns"]}
        for label, question in asked.items():
            keys = [c.key for c in ws.search(question, sources=list(bench.sources), k=K).candidates]
            rank = next((i for i, key in enumerate(keys, 1) if key in relevant[case["query_id"]]), None)
            row[label] = {"first_relevant_rank": rank, "top": keys[0] if keys else None}
        results.add(case["query_id"], row)
        print(json.dumps(row), flush=True)
    rows = list(results.rows.values())
    hits = {label: float(np.mean([r[label]["first_relevant_rank"] is not None for r in rows])) for label in LABELS}
    mrr = {label: float(np.mean([1 / r[label]["first_relevant_rank"] if r[label]["first_relevant_rank"] else 0.0
                                 for r in rows])) for label in LABELS}
    results.finish(markdown(results, hits, mrr), hit=hits, mrr=mrr)


def markdown(results: ResultsFile, hits: dict, mrr: dict) -> str:
    rows = list(results.rows.values())
    lines = ["# A follow-up question: the last turn alone or the conversation\n",
             f"{results.provenance} {len(rows)} two-turn cases written from HotpotQA questions "
             "(bench/conversation_cases.json), searched over the federated benchmark's nine sources with the "
             "defaults (select, hybrid); a hit is a relevant document of the case's HotpotQA question in the top "
             f"{K}.\n",
             f"| question searched | hit@{K} | MRR@{K} |", "|---|---|---|"]
    lines += [f"| {label} | {hits[label]:.2f} | {mrr[label]:.2f} |" for label in LABELS]
    lines += ["", "| follow-up | last turn alone: first relevant rank | joined: first relevant rank |", "|---|---|---|"]
    lines += [f"| {r['turns'][-1]} | {r['last turn alone']['first_relevant_rank'] or '-'} | "
              f"{r['joined turns']['first_relevant_rank'] or '-'} |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
