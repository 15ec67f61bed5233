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
"extractive"`): answer-contains-gold, prompt tokens and generation seconds. Writes results/evidence/results.{md,json}
(the JSON after each question, each question's own values; the page from their means).

    python bench/evidence.py --queries 100 --oracle 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
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
from gradfuse.eval.record import ResultsFile

ROOT = Path(__file__).resolve().parents[1]
HOTPOT = ROOT.parent / "shared" / "data" / "hotpotqa_train100_hipporag"
OUT = ROOT / "results" / "evidence"
ENCODER = "all-MiniLM-L6-v2@float32"
METRICS = ["recall@2", "recall@4", "recall@6", "precision@2", "precision@4", "precision@6"]
SCORERS = [("gate", {}), ("gate-calibrated", {"calibrated": True}), ("cosine", {}), ("upr", {}), ("loo", {})]
POOLS = ("gold", "dense")
KEPT = 4
EVIDENCE_TOKENS = 256  # the evidence context's budget (the default before evidence_budget.py chose 384 on dev)
ANSWER_TOKENS = 48


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


@dataclass
class Materials:
    """What every question is measured with: the data set, its dense index and the models."""

    corpus: dict[str, dict]
    spans: dict[str, list[tuple]]
    gold_docs: dict[str, list[str]]
    support: dict[str, dict[str, int]]  # question → "doc#sentence" → relevance
    ids: list[str]
    vectors: np.ndarray
    encoder: object
    lm: object
    generator: object

    def tokens(self, texts) -> int:
        return sum(len(self.lm.tokenizer.encode(t)) for t in texts)


def materials() -> Materials:
    corpus = {d["id"]: d for d in read_jsonl(HOTPOT / "corpus.jsonl")}
    spans = {d["id"]: [tuple(s) for s in d["spans"]] for d in read_jsonl(HOTPOT / "sentences.jsonl")}
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
    return Materials(corpus, spans, gold_docs, support, ids, vectors, encoder, lm, make_generator("smollm2"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--oracle", type=int, default=10, help="questions that also get exact leave-one-out")
    parser.add_argument("--pool", type=int, default=5, help="passages the dense prior puts first")
    args = parser.parse_args()
    queries = read_jsonl(HOTPOT / "queries.jsonl")[: args.queries]
    m = materials()
    results = ResultsFile.start(OUT, " ".join(["python bench/evidence.py", *sys.argv[1:]]), queries=len(queries),
                                oracle_queries=min(args.oracle, len(queries)), pool=args.pool, encoder=ENCODER,
                                kept=KEPT, evidence_tokens=EVIDENCE_TOKENS, answer_tokens=ANSWER_TOKENS)
    for number, query in enumerate(queries):
        results.add(query["id"], measure(m, query, args.pool, with_oracle=number < args.oracle))
        print(f"{number + 1}/{len(queries)}", file=sys.stderr, flush=True)
    results.header["seconds_by_units"] = timings_by_units(m.lm, m.encoder, m.corpus, m.spans)
    page = report(results)
    results.finish(page)
    print(page)


def measure(m: Materials, query: dict, pool_size: int, *, with_oracle: bool) -> dict:
    """One question: each pool's sentences by every scorer, and on the dense pool the answers compared."""
    vector = m.encoder.encode_query(query["text"])
    dense = [m.ids[i] for i in np.argsort(-(m.vectors @ vector), kind="stable")[:pool_size]]
    row: dict = {"pools": {}, "answers": {}}
    for pool, docs in zip(POOLS, (m.gold_docs[query["id"]], dense)):
        answered = row["answers"] if pool == "dense" else None
        row["pools"][pool] = measure_pool(m, query, vector, docs, answered, with_oracle=with_oracle)
    return row


def measure_pool(m: Materials, query: dict, vector, docs: list[str], answered: dict | None, *,
                 with_oracle: bool) -> dict:
    """The pool's answer-in-pool and tokens, and per scorer supporting-sentence recall and precision, whether the
    answer is in its top KEPT sentences and its seconds; where `answered` is given, the answers go in there."""
    passages = [Passage(f"{m.corpus[d]['title']}: ", m.corpus[d]["text"], m.spans[d]) for d in docs]
    units = [f"{d}#{i}" for d in docs for i in range(len(m.spans[d]))]
    texts = [s for p in passages for s in p.sentence_texts()]
    answers = tuple(query.get("answers", []))
    row = {"answer_in_pool": answer_in_context(answers, texts), "tokens": m.tokens(texts), "scorers": {}}
    for name, options in SCORERS:
        if name == "loo" and not with_oracle:
            continue
        started = time.perf_counter()
        values = score_evidence(name.removesuffix("-calibrated"), query["text"], passages, lm=m.lm,
                                embed=m.encoder.encode, query_vector=vector, **options)
        seconds = time.perf_counter() - started
        top = [texts[i] for i in np.argsort(-values, kind="stable")[:KEPT]]
        row["scorers"][name] = {**support_found(m.support[query["id"]], query["id"], units, values),
                                "answer_in_top4": answer_in_context(answers, top), "seconds": seconds}
        if name == "gate":
            row["tokens_top4"] = m.tokens(top)
        if answered is not None and name != "loo":
            ranked = evidence_of(docs, m.corpus, passages, values)
            extractive = extractive_answer(ranked)
            answered[f"extractive ({name})"] = {"contains_gold": answer_in_context(answers, [extractive])}
            if name in ("gate-calibrated", "cosine"):
                compare_generation(m, query["text"], docs, ranked, answers, answered, f"evidence ({name})",
                                   with_passages=name == "cosine")
    return row


def support_found(support: dict[str, int], query_id: str, units: list[str], values) -> dict[str, float]:
    """Supporting-sentence recall@k and precision@k of one question's sentence values (ranx)."""
    scores = evaluate(Qrels({query_id: support}), Run({query_id: {u: float(v) for u, v in zip(units, values)}}),
                      METRICS, make_comparable=True)
    return {metric: float(value) for metric, value in scores.items()}


def evidence_of(docs, corpus, passages, values) -> list[Evidence]:
    """The pool's sentences as Evidence records, best first."""
    values = iter(values)
    scored = [Evidence.of(number, candidate(doc, corpus), span, next(values))
              for number, (doc, passage) in enumerate(zip(docs, passages), start=1) for span in passage.sentences]
    return sorted(scored, key=lambda e: -e.score)


def candidate(doc: str, corpus: dict) -> Candidate:
    return Candidate("hotpotqa", doc, corpus[doc]["text"], 0.0, 1, title=corpus[doc]["title"])


def compare_generation(m: Materials, question, docs, ranked, answers, answered: dict, name: str, *,
                       with_passages: bool) -> None:
    """The bundled generator over the evidence sentences alone (and, once a question, over whole passages)."""
    shown = [candidate(d, m.corpus) for d in docs]
    budget = excerpts(ranked, lambda text: len(m.lm.tokenizer.encode(text, add_special_tokens=False)),
                      EVIDENCE_TOKENS)
    contexts = [(name, build_messages(question, shown, excerpts=budget))]
    if with_passages:
        contexts.append(("passages", build_messages(question, shown)))
    for how, messages in contexts:
        started = time.perf_counter()
        text = m.generator.generate(messages, max_new_tokens=ANSWER_TOKENS, passages=len(shown))
        answered[how] = {"contains_gold": answer_in_context(answers, [text]),
                         "prompt_tokens": m.generator.count_tokens(messages),
                         "generation_seconds": time.perf_counter() - started}


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


def known_mean(values) -> float:
    """The mean over the questions that have the value (answer checks are None where no answer string is
    checkable)."""
    return float(np.mean([v for v in values if v is not None]))


def report(results: ResultsFile) -> str:
    header, rows = results.header, list(results.rows.values())
    lines = [f"# Sentence evidence on HotpotQA ({len(rows)} questions; leave-one-out on the first "
             f"{header['oracle_queries']})", "",
             f"{results.provenance} Sentences and supporting facts are the data "
             "set's own. `gold`: the question's two gold paragraphs; `dense`: the top "
             f"{header['pool']} paragraphs by MiniLM cosine over the 994-paragraph corpus. Scoring LM: bundled "
             "SmolLM2-135M, float32; the gate's target is the question (query likelihood). Seconds are per "
             "question.", "",
             "| pool / scorer | questions | " + " | ".join(METRICS) + " | answer in top 4 | s / question |",
             "|---|---:|" + "---:|" * (len(METRICS) + 2)]
    for pool in POOLS:
        for name, _ in SCORERS:
            cells = [r["pools"][pool]["scorers"][name] for r in rows if name in r["pools"][pool]["scorers"]]
            if cells:
                lines.append(f"| {pool}/{name} | {len(cells)} | "
                             + " | ".join(f"{np.mean([c[m] for c in cells]):.3f}" for m in METRICS)
                             + f" | {known_mean(c['answer_in_top4'] for c in cells):.3f} | "
                             f"{np.mean([c['seconds'] for c in cells]):.2f} |")
    pools = {p: [r["pools"][p] for r in rows] for p in POOLS}
    lines += ["", "Answer string anywhere in the pool: " + ", ".join(
        f"{p} {known_mean(c['answer_in_pool'] for c in cells):.3f}" for p, cells in pools.items())
        + ". Tokens of the top 4 sentences (gate) against the whole pool: " + ", ".join(
        f"{p} {np.mean([c['tokens_top4'] for c in cells]):.0f} / {np.mean([c['tokens'] for c in cells]):.0f}"
        for p, cells in pools.items()) + ".", "",
              "Answers on the dense pool (the gold answer string inside the answer; generator SmolLM2-135M, "
              f"{ANSWER_TOKENS} new tokens at most):", "",
              "| answer | contains gold | prompt tokens | generation s |", "|---|---:|---:|---:|"]
    for how in dict.fromkeys(how for r in rows for how in r["answers"]):
        cells = [r["answers"][how] for r in rows if how in r["answers"]]
        value = known_mean(c["contains_gold"] for c in cells)
        lines.append(f"| {how} | {value:.3f} | {np.mean([c['prompt_tokens'] for c in cells]):.0f} | "
                     f"{np.mean([c['generation_seconds'] for c in cells]):.2f} |" if "prompt_tokens" in cells[0]
                     else f"| {how} | {value:.3f} | - | 0 |")
    growth = header.get("seconds_by_units")
    if growth:
        lines += ["", "Seconds for one question by the number of sentence units:", "",
                  "| units | " + " | ".join(growth["20"]) + " |", "|---:|" + "---:|" * len(growth["20"])]
        for n, row in growth.items():
            lines.append(f"| {n} | " + " | ".join(f"{v:.2f}" for v in row.values()) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
