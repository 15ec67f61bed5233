"""Evidence at the sentence level on HotpotQA's supporting facts (issue 20's measurement; `make bench-evidence`).

For each question, the sentences of a pool of passages are scored by each sentence scorer
(`gradfuse.rerank.sentences`): the reader gate (query-likelihood target, one forward + backward pass), the same
gate calibrated by the content-free target "N/A", MiniLM cosine, UPR per sentence, and exact leave-one-out per
sentence on the first `--oracle` questions. Two pools: the question's two gold paragraphs, and the five paragraphs
the dense prior ranks first over the whole corpus (the passages a generator would see). The sentences are the
data set's own (`sentences.jsonl`), so the supporting facts (`qrels_sentences.tsv`) are judged exactly.

Reported: supporting-sentence recall@k and precision@k (k = 2, 4, 6, from ranx), answer-in-evidence (the gold
answer inside the top-4 sentences, against inside the whole pool), the tokens kept by the top 4, seconds per
question per scorer, and the gate's and UPR's and leave-one-out's seconds at n = 20, 50 and 100 sentence units.
On the dense pool it also compares three answers: the bundled generator (SmolLM2-135M, llama.cpp) over the whole
passages, the same generator over the evidence sentences only (`[generator] context = "evidence"`, 256 tokens,
chosen by the calibrated gate), and the extractive answer (the two best sentences themselves, `answer =
"extractive"`): answer-contains-gold, prompt tokens and generation seconds. Writes results/evidence/results.{md,json}.

    python bench/evidence.py --queries 100 --oracle 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from ranx import Qrels, Run, evaluate

from gradfuse.candidate import Candidate
from gradfuse.eval.qa import answer_in_context
from gradfuse.reading.evidence import Evidence, excerpts, extractive_answer
from gradfuse.generate import build_messages, make_generator
from gradfuse.rerank import load_scorer
from gradfuse.reading.scoring import score_evidence
from gradfuse.rerank.sentences import Passage
from gradfuse.embedding.encoder import load_encoder
from gradfuse.eval.record import commit_id, machine_description

ROOT = Path(__file__).resolve().parents[1]
HOTPOT = ROOT.parent / "shared" / "data" / "hotpotqa_train100_hipporag"
OUT = ROOT / "results" / "evidence"
ENCODER = "all-MiniLM-L6-v2@float32"
METRICS = ["recall@2", "recall@4", "recall@6", "precision@2", "precision@4", "precision@6"]
SCORERS = [("gate", {}), ("gate-calibrated", {"calibrated": True}), ("cosine", {}), ("upr", {}), ("loo", {})]
KEPT = 4
EVIDENCE_TOKENS = 256  # the evidence context's budget (the default before evidence_budget.py chose 384 on dev)
ANSWER_TOKENS = 48


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--oracle", type=int, default=10, help="questions that also get exact leave-one-out")
    parser.add_argument("--pool", type=int, default=5, help="passages the dense prior puts first")
    args = parser.parse_args()
    corpus = {d["id"]: d for d in read_jsonl(HOTPOT / "corpus.jsonl")}
    spans = {d["id"]: [tuple(s) for s in d["spans"]] for d in read_jsonl(HOTPOT / "sentences.jsonl")}
    queries = read_jsonl(HOTPOT / "queries.jsonl")[: args.queries]
    gold_docs: dict[str, list[str]] = {}
    for line in open(HOTPOT / "qrels.tsv", encoding="utf-8"):
        qid, doc, _ = line.rstrip("\n").split("\t")[:3]
        gold_docs.setdefault(qid, []).append(doc)
    support: dict[str, dict[str, int]] = {}
    for line in open(HOTPOT / "qrels_sentences.tsv", encoding="utf-8"):
        qid, doc, index, relevance = line.rstrip("\n").split("\t")
        support.setdefault(qid, {})[f"{doc}#{index}"] = int(relevance)

    encoder, lm = load_encoder(ENCODER), load_scorer("smollm2", dtype="float32")
    ids = list(corpus)
    vectors = encoder.encode([f"{corpus[i]['title']}\n{corpus[i]['text']}" for i in ids])
    generator = make_generator("smollm2")
    answers_by: dict[str, list] = {}
    prompt_tokens: dict[str, list] = {}
    generation_seconds: dict[str, list] = {}
    runs = {pool: {name: {} for name, _ in SCORERS} for pool in ("gold", "dense")}
    seconds = {pool: {name: [] for name, _ in SCORERS} for pool in runs}
    in_evidence = {pool: {name: [] for name, _ in SCORERS} for pool in runs}
    in_pool, kept_tokens, pool_tokens = {pool: [] for pool in runs}, {pool: [] for pool in runs}, {p: [] for p in runs}
    for number, query in enumerate(queries):
        vector = encoder.encode_query(query["text"])
        dense = [ids[i] for i in np.argsort(-(vectors @ vector), kind="stable")[: args.pool]]
        for pool, docs in (("gold", gold_docs[query["id"]]), ("dense", dense)):
            passages = [Passage(f"{corpus[d]['title']}: ", corpus[d]["text"], spans[d]) for d in docs]
            units = [f"{d}#{i}" for d in docs for i in range(len(spans[d]))]
            texts = [s for p in passages for s in p.sentence_texts()]
            answers = tuple(query.get("answers", []))
            if (found := answer_in_context(answers, texts)) is not None:
                in_pool[pool].append(found)
            pool_tokens[pool].append(sum(len(lm.tokenizer.encode(t)) for t in texts))
            for name, options in SCORERS:
                if name == "loo" and number >= args.oracle:
                    continue
                started = time.perf_counter()
                values = score_evidence(name.removesuffix("-calibrated"), query["text"], passages, lm=lm,
                                        embed=encoder.encode, query_vector=vector, **options)
                seconds[pool][name].append(time.perf_counter() - started)
                runs[pool][name][query["id"]] = {u: float(v) for u, v in zip(units, values)}
                top = [texts[i] for i in np.argsort(-values, kind="stable")[:KEPT]]
                if (found := answer_in_context(answers, top)) is not None:
                    in_evidence[pool][name].append(found)
                if name == "gate":
                    kept_tokens[pool].append(sum(len(lm.tokenizer.encode(t)) for t in top))
                if pool == "dense" and name != "loo":
                    ranked = evidence_of(docs, corpus, passages, values)
                    answers_by.setdefault(f"extractive ({name})", []).append(
                        answer_in_context(answers, [extractive_answer(ranked)]))
                    if name in ("gate-calibrated", "cosine"):
                        compare_generation(generator, query["text"], docs, corpus, ranked, lm, answers, answers_by,
                                           prompt_tokens, generation_seconds, f"evidence ({name})",
                                           with_passages=name == "cosine")
        print(f"{number + 1}/{len(queries)}", file=sys.stderr, flush=True)

    table = {}
    for pool in runs:
        for name, _ in SCORERS:
            run = runs[pool][name]
            if not run:
                continue
            scores = evaluate(Qrels({q: support[q] for q in run}), Run(run), METRICS, make_comparable=True)
            table[f"{pool}/{name}"] = {**{m: float(v) for m, v in scores.items()}, "questions": len(run),
                                       "answer_in_top4": float(np.mean(in_evidence[pool][name])),
                                       "seconds": float(np.mean(seconds[pool][name]))}
    growth = timings_by_units(lm, encoder, corpus, spans)
    answered = {how: float(np.mean([v for v in found if v is not None])) for how, found in answers_by.items()}
    summary = {"queries": len(queries), "oracle_queries": min(args.oracle, len(queries)), "pool": args.pool,
               "table": table, "answer_in_pool": {p: float(np.mean(v)) for p, v in in_pool.items()},
               "tokens_top4": {p: float(np.mean(v)) for p, v in kept_tokens.items()},
               "tokens_pool": {p: float(np.mean(v)) for p, v in pool_tokens.items()},
               "answer_contains_gold": answered,
               "prompt_tokens": {k: float(np.mean(v)) for k, v in prompt_tokens.items()},
               "generation_seconds": {k: float(np.mean(v)) for k, v in generation_seconds.items()},
               "seconds_by_units": growth, "commit": commit_id(), "machine": machine_description()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(summary, indent=2))
    (OUT / "results.md").write_text(report(summary))
    print(report(summary))


def evidence_of(docs, corpus, passages, values) -> list[Evidence]:
    """The pool's sentences as Evidence records, best first."""
    values = iter(values)
    scored = [Evidence.of(number, candidate(doc, corpus), span, next(values))
              for number, (doc, passage) in enumerate(zip(docs, passages), start=1) for span in passage.sentences]
    return sorted(scored, key=lambda e: -e.score)


def candidate(doc: str, corpus: dict) -> Candidate:
    return Candidate("hotpotqa", doc, corpus[doc]["text"], 0.0, 1, title=corpus[doc]["title"])


def compare_generation(generator, question, docs, corpus, ranked, lm, answers, answers_by, prompt_tokens,
                       generation_seconds, name: str, *, with_passages: bool) -> None:
    """The bundled generator over the evidence sentences alone (and, once a question, over whole passages)."""
    shown = [candidate(d, corpus) for d in docs]
    budget = excerpts(ranked, lambda text: len(lm.tokenizer.encode(text, add_special_tokens=False)), EVIDENCE_TOKENS)
    contexts = [(name, build_messages(question, shown, excerpts=budget))]
    if with_passages:
        contexts.append(("passages", build_messages(question, shown)))
    for how, messages in contexts:
        started = time.perf_counter()
        text = generator.generate(messages, max_new_tokens=ANSWER_TOKENS, passages=len(shown))
        generation_seconds.setdefault(how, []).append(time.perf_counter() - started)
        prompt_tokens.setdefault(how, []).append(generator.count_tokens(messages))
        answers_by.setdefault(how, []).append(answer_in_context(answers, [text]))


def timings_by_units(lm, encoder, corpus, spans) -> dict[str, dict[str, float]]:
    """Seconds of one question's scoring at n = 20, 50 and 100 sentence units (the paragraphs of the corpus in
    file order until n sentences, one query): the gate's single pass against one pass per unit."""
    question = "Which film did the director of the documentary also write?"
    vector = encoder.encode_query(question)
    growth = {}
    for n in (20, 50, 100):
        passages, count = [], 0
        for doc_id, units in spans.items():
            take = units[: n - count]
            passages.append(Passage(f"{corpus[doc_id]['title']}: ", corpus[doc_id]["text"][: take[-1][1]], take))
            count += len(take)
            if count >= n:
                break
        growth[str(n)] = {}
        for name, options in SCORERS:
            started = time.perf_counter()
            score_evidence(name.removesuffix("-calibrated"), question, passages, lm=lm, embed=encoder.encode,
                           query_vector=vector, **options)
            growth[str(n)][name] = time.perf_counter() - started
    return growth


def report(summary: dict) -> str:
    lines = [f"# Sentence evidence on HotpotQA ({summary['queries']} questions; leave-one-out on the first "
             f"{summary['oracle_queries']})", "",
             "Made by `make bench-evidence` (`bench/evidence.py`). Sentences and supporting facts are the data "
             "set's own. `gold`: the question's two gold paragraphs; `dense`: the top "
             f"{summary['pool']} paragraphs by MiniLM cosine over the 994-paragraph corpus. Scoring LM: bundled "
             "SmolLM2-135M, float32; the gate's target is the question (query likelihood). Seconds are per "
             f"question on {summary['machine']}.", "",
             "| pool / scorer | questions | " + " | ".join(METRICS) + " | answer in top 4 | s / question |",
             "|---|---:|" + "---:|" * (len(METRICS) + 2)]
    for key, row in summary["table"].items():
        lines.append(f"| {key} | {row['questions']} | " + " | ".join(f"{row[m]:.3f}" for m in METRICS)
                     + f" | {row['answer_in_top4']:.3f} | {row['seconds']:.2f} |")
    lines += ["", "Answer string anywhere in the pool: " + ", ".join(
        f"{p} {v:.3f}" for p, v in summary["answer_in_pool"].items()) + ". Tokens of the top 4 sentences (gate) "
        "against the whole pool: " + ", ".join(f"{p} {summary['tokens_top4'][p]:.0f} / {summary['tokens_pool'][p]:.0f}"
                                              for p in summary["tokens_pool"]) + ".", "",
              "Answers on the dense pool (the gold answer string inside the answer; generator SmolLM2-135M, "
              f"{ANSWER_TOKENS} new tokens at most):", "",
              "| answer | contains gold | prompt tokens | generation s |", "|---|---:|---:|---:|"]
    for how, value in summary["answer_contains_gold"].items():
        tokens = summary["prompt_tokens"].get(how)
        seconds = summary["generation_seconds"].get(how)
        lines.append(f"| {how} | {value:.3f} | {tokens:.0f} | {seconds:.2f} |" if tokens is not None
                     else f"| {how} | {value:.3f} | - | 0 |")
    lines += ["", "Seconds for one question by the number of sentence units:", "",
              "| units | " + " | ".join(summary["seconds_by_units"]["20"]) + " |",
              "|---:|" + "---:|" * len(summary["seconds_by_units"]["20"])]
    for n, row in summary["seconds_by_units"].items():
        lines.append(f"| {n} | " + " | ".join(f"{v:.2f}" for v in row.values()) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
