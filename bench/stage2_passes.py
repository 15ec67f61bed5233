"""What one stage-2 pass costs and how far its cheaper variants keep the exact one's order, on real passages.

For each of the first DL19 queries: the 10 passages RRF ranks first over the six DL19 runs (up to 128 tokens
each, the library's defaults), scored by the bundled SmolLM2 with
- the query target: full gate (fp32, and bf16), reader gate (fp32, and bf16), UPR, the relevance prompt, and
  exact leave-one-out (the reference the estimators approximate);
- the signals that read the whole context: calibrated attention (ICR: the documents once, then the question and
  "N/A"), the calibrated reader gate, and 3 rounds of conditional selection (one-pass estimate, and set-level UPR);
- the draft target: a 32-token draft from the documents' cache plus the reader-gate pass that reuses it; and, for
  comparison, the same draft through llama.cpp (the Q4_1 GGUF) from the same token ids.
Reported: p50 seconds of each, Spearman of the bf16 scores with fp32 (bf16 is used only where it stays >= 0.95)
and of each estimator with leave-one-out.

Run: make bench-stage2 (`python bench/stage2_passes.py [--queries N]`); writes results/stage2/passes.{md,json} (the
JSON after each query).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from gradfuse.eval.benchmark import load_benchmark
from gradfuse.eval.record import ResultsFile
from gradfuse.eval.runner import queries_and_qrels
from gradfuse.generate.llamacpp import load_llamacpp
from gradfuse.lm.models import bundled_gguf
from gradfuse.rerank import RerankSettings, load_scorer, passage_text
from gradfuse.rerank.attention import AttentionScorer
from gradfuse.rerank.conditional import ConditionalGateScorer
from gradfuse.rerank.gradient import CalibratedGateScorer
from gradfuse.rerank.relevance import RelevancePromptScorer
from gradfuse.rerank.set_upr import SetUPRScorer
from gradfuse.rerank.upr import UPRScorer
from gradfuse.workspace import Workspace
from gradfuse.config import Config

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "stage2"
N, DOC_TOKENS, DRAFT_TOKENS = 10, 128, 32


def pools(count: int) -> list[tuple[str, str, list[str]]]:
    """(query id, question, its RRF top N passages) of the first `count` DL19 queries."""
    bench = load_benchmark(ROOT / "benchmarks" / "dl19.toml")
    ws = Workspace(Config(workspace=bench.workspace, depth=100, retrieval=bench.retrieval))
    for spec in bench.sources.values():
        ws.index(spec)
    queries, _, _ = queries_and_qrels(bench)
    out = []
    for query in queries[:count]:
        ranked = ws.rank(query.text, ws.retrieve(query.text, sources=list(bench.sources), depth=100), method="rrf",
                         k=N)
        out.append((query.query_id, query.text, [passage_text(c) for c in ranked.candidates]))
    return out


def timed(function):
    started = time.perf_counter()
    value = function()
    return value, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=12)
    args = parser.parse_args()
    fp32, bf16 = load_scorer("smollm2", DOC_TOKENS, "float32"), load_scorer("smollm2", DOC_TOKENS, "bfloat16")
    upr, relevance = UPRScorer(fp32), RelevancePromptScorer(fp32)
    query_settings = RerankSettings(n=N, doc_tokens=DOC_TOKENS, target="query", set_rounds=3)
    whole_context = {"attention, calibrated (ICR)": (AttentionScorer(fp32), "attention"),
                     "reader gate, calibrated (two short passes)": (CalibratedGateScorer(fp32), "calibrated_gate"),
                     "conditional gate, 3 rounds": (ConditionalGateScorer(fp32), "conditional_gate"),
                     "set-level UPR, 3 rounds (exact)": (SetUPRScorer(fp32), "set_upr")}
    engine = load_llamacpp(str(bundled_gguf()))
    results = ResultsFile.start(OUT, f"python bench/stage2_passes.py --queries {args.queries}", name="passes",
                                queries=args.queries, n=N, doc_tokens=DOC_TOKENS, draft_tokens=DRAFT_TOKENS,
                                torch_threads=torch.get_num_threads())
    for index, (query_id, question, docs) in enumerate(pools(args.queries + 1)):
        packed = fp32.pack(docs, question, question, target_is_query=True)
        runs = {
            "gate fp32": lambda: fp32.attribute(packed).gate,
            "gate bf16": lambda: bf16.attribute(packed).gate,
            "reader gate fp32": lambda: fp32.attribute_reader(packed)[1],
            "reader gate bf16": lambda: bf16.attribute_reader(packed)[1],
            "upr": lambda: upr.values(question, docs),
            "relevance prompt": lambda: relevance.score(question, docs, None).values["relevance"],
            "leave-one-out (n + 1 passes)": lambda: fp32.leave_one_out(docs, question, question,
                                                                      target_is_query=True)[1],
            **{name: (lambda s=scorer, key=key: s.score(question, docs, query_settings).values[key])
               for name, (scorer, key) in whole_context.items()},
        }
        values, seconds = {}, {}
        for name, run in runs.items():
            values[name], seconds[name] = timed(run)

        def draft_and_pass():
            prompt = fp32.packer.pack(docs, question=question, target=None)
            documents = fp32.encode_documents(prompt)
            draft = fp32.draft(docs, question, max_new_tokens=DRAFT_TOKENS, documents=documents)
            return fp32.attribute_reader(fp32.pack(docs, question, draft), documents)

        _, seconds["draft target: draft from the documents' cache + reader gate"] = timed(draft_and_pass)
        prompt_ids = fp32.packer.pack(docs, question=question, target=None).input_ids.tolist()
        _, seconds["draft alone through llama.cpp (Q4_1 GGUF, same token ids)"] = timed(
            lambda: engine.complete(prompt_ids, max_new_tokens=DRAFT_TOKENS))
        if index:  # the first query warms every path up and is not counted
            results.add(query_id, {"packed_tokens": packed.length, "seconds": seconds,
                                   "spearman": agreement(values, whole_context)})
            print(f"query {index}: {packed.length} tokens", flush=True)
    results.finish(markdown(results))


def agreement(values: dict, whole_context: dict) -> dict[str, float]:
    """Spearman of bf16 with fp32 and of the reader gate with the full gate; of each estimator with leave-one-out."""
    pairs = {f"{a} vs {b}": (a, b) for a, b in (("gate bf16", "gate fp32"), ("reader gate bf16", "reader gate fp32"),
                                                ("reader gate fp32", "gate fp32"))}
    pairs |= {f"{name} vs leave-one-out": (name, "leave-one-out (n + 1 passes)")
              for name in ("gate fp32", "reader gate fp32", "upr", "relevance prompt", *whole_context)}
    return {pair: float(spearmanr(values[a], values[b])[0]) for pair, (a, b) in pairs.items()}


def statistics(rows: list[dict]) -> dict:
    """p50 and p95 seconds of each pass and mean and least Spearman of each pair, over the queries measured."""
    seconds = {k: [r["seconds"][k] for r in rows] for k in rows[0]["seconds"]}
    spearman = {k: [r["spearman"][k] for r in rows] for k in rows[0]["spearman"]}
    return {"packed_tokens_p50": float(np.median([r["packed_tokens"] for r in rows])),
            "seconds_p50": {k: round(float(np.median(v)), 3) for k, v in seconds.items()},
            "seconds_p95": {k: round(float(np.percentile(v, 95)), 3) for k, v in seconds.items()},
            "spearman_mean": {k: round(float(np.nanmean(v)), 3) for k, v in spearman.items()},
            "spearman_min": {k: round(float(np.nanmin(v)), 3) for k, v in spearman.items()}}


def markdown(results: ResultsFile) -> str:
    summary = statistics(list(results.rows.values()))
    rows = "\n".join(f"| {k} | {summary['seconds_p50'][k]:.2f} | {summary['seconds_p95'][k]:.2f} |"
                     for k in summary["seconds_p50"])
    agree = "\n".join(f"| {k} | {summary['spearman_mean'][k]:.3f} | {summary['spearman_min'][k]:.3f} |"
                      for k in summary["spearman_mean"])
    return f"""# Stage-2 passes: cost and agreement

{results.provenance} {results.header['torch_threads']} torch threads. {len(results.rows)} DL19 queries (one more
warms up, uncounted), each with the 10 passages RRF ranks first over the six runs, up to {DOC_TOKENS} tokens each:
{summary['packed_tokens_p50']:.0f} packed tokens (p50), the query as target unless said.

| pass | p50 s | p95 s |
|---|---:|---:|
{rows}

| Spearman over the 10 passages | mean | min |
|---|---:|---:|
{agree}
"""


if __name__ == "__main__":
    main()
