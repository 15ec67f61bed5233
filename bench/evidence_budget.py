"""Evidence contexts and extractive answers on the QA benchmark's answerable questions (issue 20's second
measurement; part of `make bench-evidence`).

Questions with answer strings a match can check: HotpotQA's 100 (the first 20 are dev), and TAT-QA's span
answers from text (the first 40 of its dev split, the first 60 of its test split). Each question's passages are
the five its data set's dense prior (MiniLM cosine over the whole corpus) puts first, and its evidence is what
`Workspace.evidence` gives them with the shipped `[evidence]` settings (the reader gate, query target), over the
600 characters of each passage the generator's prompt shows.

- dev: for each token budget, the share of questions whose gold answer is inside the kept sentences
  (answer-in-context) and the scoring LM's gold NLL given them, against the whole passages. The budget chosen
  is the smallest whose answer-in-context is at least 95% of the passages'.
- test: answer-in-context, gold NLL and tokens of evidence against passages at every budget; and three answers
  (the gold answer string inside the answer): the bundled generator (SmolLM2-135M, llama.cpp) over the whole
  passages, the same generator over the evidence at the chosen budget, and the extractive answer (`answer = "extractive"`).

Writes results/evidence/budget.{md,json} (the JSON after each question).

    python bench/evidence_budget.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gradfuse import Workspace
from gradfuse.candidate import Candidate
from gradfuse.config import Config
from gradfuse.eval.qa import answer_in_context
from gradfuse.reading.evidence import excerpts, extractive_answer
from gradfuse.generate import build_messages, make_generator
PASSAGE_CHARS = 600  # what the prompt showed of each passage before issue 70 (these rows measure that)
from gradfuse.rerank import load_scorer
from gradfuse.embedding.encoder import load_encoder
from gradfuse.eval.record import ResultsFile

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "results" / "evidence"
ENCODER = "all-MiniLM-L6-v2@float32"
BUDGETS = (64, 128, 192, 256, 384)
KEEP_SHARE = 0.95  # of the passages' answer-in-context an evidence budget must keep
POOL = 5
ANSWER_TOKENS = 48


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def question_sets() -> dict[str, dict[str, list[dict]]]:
    hotpot = read_jsonl(DATA / "hotpotqa_train100_hipporag" / "queries.jsonl")
    tatqa = [q for q in read_jsonl(DATA / "tatqa_hybrid" / "queries.jsonl")
             if q["answer_type"] == "span" and q["answer_from"] == "text"]
    return {"hotpotqa": {"dev": hotpot[:20], "test": hotpot[20:]},
            "tatqa": {"dev": [q for q in tatqa if q["split"] == "dev"][:40],
                      "test": [q for q in tatqa if q["split"] == "test"][:60]}}


FOLDERS = {"hotpotqa": "hotpotqa_train100_hipporag", "tatqa": "tatqa_hybrid"}


class Pools:
    """The dense prior's top passages of one data set's corpus, as candidate records."""

    def __init__(self, name: str, encoder):
        self.name, self.encoder = name, encoder
        self.corpus = read_jsonl(DATA / FOLDERS[name] / "corpus.jsonl")
        self.vectors = encoder.encode([f"{d.get('title', '')}\n{d['text']}" for d in self.corpus])

    def top(self, question: str) -> list[Candidate]:
        order = np.argsort(-(self.vectors @ self.encoder.encode_query(question)), kind="stable")[:POOL]
        return [Candidate(self.name, self.corpus[i]["id"], self.corpus[i]["text"], 0.0, rank,
                          title=self.corpus[i].get("title", "")) for rank, i in enumerate(order, start=1)]


def main() -> None:
    encoder = load_encoder(ENCODER)
    pools = {name: Pools(name, encoder) for name in FOLDERS}
    nll_lm = load_scorer("smollm2", 4096, "float32")  # whole shown passages, never cut to doc_tokens
    count = lambda text: len(nll_lm.tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    generator = make_generator("smollm2")
    sets = question_sets()
    counts = {name: {part: len(qs) for part, qs in parts.items()} for name, parts in sets.items()}
    results = ResultsFile.start(OUT, "python bench/evidence_budget.py", name="budget", budgets=list(BUDGETS),
                                keep_share=KEEP_SHARE, pool=POOL, passage_chars=PASSAGE_CHARS, encoder=ENCODER,
                                answer_tokens=ANSWER_TOKENS, questions=counts)
    with tempfile.TemporaryDirectory() as folder:
        workspace = Workspace(Config(workspace=Path(folder)))
        for name, parts in sets.items():
            for q in parts["dev"]:
                results.add(f"{name}/{q['id']}", {"set": name, "part": "dev",
                                                  **measure(workspace, pools[name], q, nll_lm, count)})
        chosen, met = choose_budget([r for r in results.rows.values() if r["part"] == "dev"])
        results.header.update(chosen_budget=chosen, budget_rule_met=met)
        for name, parts in sets.items():
            for number, q in enumerate(parts["test"], start=1):
                row = measure(workspace, pools[name], q, nll_lm, count, generator=generator, budget=chosen)
                results.add(f"{name}/{q['id']}", {"set": name, "part": "test", **row})
                print(f"{name} {number}/{len(parts['test'])}", file=sys.stderr, flush=True)
    page = report(results)
    results.finish(page)
    print(page)


def measure(workspace, pools: Pools, query: dict, nll_lm, count, *, generator=None, budget=None) -> dict:
    """One question's answer-in-context, gold NLL and tokens for the passages and each evidence budget; with a
    generator, its answers over both contexts and the extractive answer."""
    question, answers = query["text"], tuple(query["answers"])
    passages = pools.top(question)
    started = time.perf_counter()
    evidence = workspace.evidence(question, passages, chars=PASSAGE_CHARS)
    row = {"evidence_seconds": time.perf_counter() - started}
    shown = [c.text[:PASSAGE_CHARS] for c in passages]
    contexts = {"passages": [f"{c.title}: {text}" if c.title else text for c, text in zip(passages, shown)]}
    row["tokens"] = {"passages": sum(count(t) for t in shown)}
    kept = {b: excerpts(evidence, count, b) for b in BUDGETS}
    for b, by_passage in kept.items():
        contexts[f"evidence@{b}"] = [f"{passages[n - 1].title}: " * bool(passages[n - 1].title) + " … ".join(texts)
                                     for n, texts in by_passage.items()]
        row["tokens"][f"evidence@{b}"] = sum(count(t) for texts in by_passage.values() for t in texts)
    row["answer_in_context"] = {how: answer_in_context(answers, texts) for how, texts in contexts.items()}
    losses = nll_lm.losses([nll_lm.pack(texts, question, answers[0]) for texts in contexts.values()])
    row["nll"] = dict(zip(contexts, (float(v) for v in losses)))
    if generator is None:
        return row
    row["answer"] = {"extractive": answer_in_context(answers, [extractive_answer(evidence)])}
    row["generation_seconds"], row["prompt_tokens"] = {}, {}
    for how, messages in (("generated over passages", build_messages(question, passages, max_chars=PASSAGE_CHARS)),
                          (f"generated over evidence@{budget}",
                           build_messages(question, passages, excerpts=kept[budget]))):
        started = time.perf_counter()
        text = generator.generate(messages, max_new_tokens=ANSWER_TOKENS, passages=len(passages))
        row["generation_seconds"][how] = time.perf_counter() - started
        row["prompt_tokens"][how] = generator.count_tokens(messages)
        row["answer"][how] = answer_in_context(answers, [text])
    return row


def choose_budget(rows: list[dict]) -> tuple[int, bool]:
    """The smallest budget that keeps KEEP_SHARE of the passages' answer-in-context; where none does, the
    largest (and False)."""
    full = mean([r["answer_in_context"]["passages"] for r in rows])
    for b in BUDGETS:
        if mean([r["answer_in_context"][f"evidence@{b}"] for r in rows]) >= KEEP_SHARE * full:
            return b, True
    return BUDGETS[-1], False


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def part_by_set(results: ResultsFile, part: str) -> dict[str, list[dict]]:
    """The finished questions of one part (dev or test), by data set."""
    out: dict[str, list[dict]] = {}
    for row in results.rows.values():
        if row["part"] == part:
            out.setdefault(row["set"], []).append(row)
    return out


def summarise(by_set: dict[str, list[dict]]) -> dict:
    out = {}
    for name, rows in by_set.items():
        keys = rows[0]["answer_in_context"]
        out[name] = {"answer_in_context": {k: mean([r["answer_in_context"][k] for r in rows]) for k in keys},
                     "nll": {k: mean([r["nll"][k] for r in rows]) for k in keys},
                     "tokens": {k: mean([r["tokens"][k] for r in rows]) for k in keys},
                     "evidence_seconds": mean([r["evidence_seconds"] for r in rows])}
        if "answer" in rows[0]:
            out[name]["answer_contains_gold"] = {k: mean([r["answer"][k] for r in rows]) for k in rows[0]["answer"]}
            for field in ("generation_seconds", "prompt_tokens"):
                out[name][field] = {k: mean([r[field][k] for r in rows]) for k in rows[0][field]}
    return out


def report(results: ResultsFile) -> str:
    header, chosen = results.header, results.header.get("chosen_budget")
    summary = {part: summarise(part_by_set(results, part)) for part in ("dev", "test")}
    lines = ["# Evidence contexts and extractive answers (HotpotQA, TAT-QA text spans)", "",
             f"{results.provenance} Passages: the dense prior's top 5 of each "
             "data set (MiniLM cosine over its whole corpus), the 600 characters of each the prompt shows. Evidence: "
             "`Workspace.evidence` with the shipped `[evidence]` settings (reader gate, query target). Gold NLL: the "
             "scoring LM's (SmolLM2-135M) mean token NLL of the gold answer given the context. Questions: " +
             ", ".join(f"{n} {q['dev']} dev + {q['test']} test" for n, q in header["questions"].items()) + ".", "",
             "## Dev: the evidence budget", ""]
    if chosen is not None:  # chosen once every dev question is measured
        lines += [(f"The chosen budget is the smallest whose answer-in-context (both sets' dev questions) is at least "
                   f"{KEEP_SHARE:.0%} of the whole passages': **{chosen} tokens**." if header["budget_rule_met"] else
                   f"No budget keeps {KEEP_SHARE:.0%} of the whole passages' answer-in-context on the dev questions "
                   f"(both sets together), so the rule keeps the largest: **{chosen} tokens**."), ""]
    lines += context_table(summary["dev"])
    if not summary["test"]:
        return "\n".join(lines) + "\n"
    lines += ["", f"## Test (the chosen budget: {chosen} tokens)", "", *context_table(summary["test"]), "",
              f"Answers on the test questions (the gold answer string inside the answer; {ANSWER_TOKENS} new tokens "
              "at most):", "",
              "| set | answer | contains gold | prompt tokens | generation s |", "|---|---|---:|---:|---:|"]
    for name, row in summary["test"].items():
        for how, value in row["answer_contains_gold"].items():
            tokens, seconds = row["prompt_tokens"].get(how), row["generation_seconds"].get(how)
            lines.append(f"| {name} | {how} | {value:.3f} | " + (f"{tokens:.0f} | {seconds:.2f} |" if tokens
                                                                   else "- | 0 |"))
        lines.append(f"| {name} | (evidence scoring, every answer) | | | {row['evidence_seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def context_table(summary: dict) -> list[str]:
    """Answer-in-context, gold NLL and tokens of each context, per data set."""
    lines = ["| set | context | answer in context | gold NLL | tokens |", "|---|---|---:|---:|---:|"]
    for name, row in summary.items():
        for how in row["answer_in_context"]:
            lines.append(f"| {name} | {how} | {row['answer_in_context'][how]:.3f} | {row['nll'][how]:.3f} | "
                         f"{row['tokens'][how]:.0f} |")
    return lines


if __name__ == "__main__":
    main()
