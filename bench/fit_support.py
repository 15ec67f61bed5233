"""Fit the `support` evidence scorer (src/gradfuse/rerank/support.py) on dev questions only, and choose the
threshold below which an answer says "not found in these sources" (the first half of `make bench-answers`).

Dev questions:
- HotpotQA's first 20 and TAT-QA's dev span answers from text, each with the five passages the dense prior ranks
  first in its corpus, their first PASSAGE_CHARS characters (the QA benchmark's protocol, `bench/evidence_budget.py`;
  their test questions are never read here);
- the dev third of the answer benchmark (`bench/answers.py`) with the default method's five passages, whole (as a
  quoted answer reads them): its questions
  over real documents for the sentence weights (its HotpotQA and TAT-QA questions come from the QA sets' test
  questions, so they are left out of that fit), and all of them, answerable or not, for the "not found" model.

Sentence weights: a conditional logit over each question's sentences (the sentences holding the gold answer against
the rest), L2-regularised, each of the three question sets weighing the same, over the signals that 5-fold
cross-validation on the same dev questions chose: the set whose two best sentences hold the gold answer most often
(mean over the three sets; the fewer signals where two sets tie). "Not found": a logistic model of
whether the passages hold the answer, from the best sentence's overlap and cosine; the threshold is the highest that
declines at most 10% of the answerable dev questions. Writes src/gradfuse/rerank/support.json and
results/answers/fit.{md,json}.

    python bench/fit_support.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import answers  # noqa: E402
from evidence_budget import FOLDERS, Pools, read_jsonl, DATA  # noqa: E402

from gradfuse.eval.qa import answer_in_context, checkable  # noqa: E402
from gradfuse.generate.prompt import PASSAGE_CHARS  # noqa: E402
from gradfuse.rerank import support  # noqa: E402

OUT = answers.OUT
MAX_WRONG_DECLINES = 0.10  # of answerable dev questions
L2 = 0.01


def sentence_signals(ws, question: str, passages, chars: int | None = None) -> tuple[list[str], dict[str, np.ndarray]]:
    """The sentences `Workspace.evidence` cuts from the passages (their first `chars` characters), with their
    signals."""
    scored = ws.evidence(question, passages, settings=replace(ws.config.evidence, scorer="cosine"), chars=chars)
    texts = [e.text for e in scored]
    return texts, support.signals(question, texts, np.array([e.score for e in scored]))


def qa_dev(ws) -> list[dict]:
    encoder = ws._encoder()
    pools = {name: Pools(name, encoder) for name in FOLDERS}
    tatqa = [q for q in read_jsonl(DATA / "tatqa_hybrid" / "queries.jsonl") if q["split"] == "dev"
             and q["answer_type"] == "span" and q["answer_from"] == "text"]
    sets = {"hotpotqa": read_jsonl(DATA / "hotpotqa_train100_hipporag" / "queries.jsonl")[:20], "tatqa": tatqa}
    rows = []
    for name, questions in sets.items():
        for q in questions:
            if checkable(tuple(q["answers"])):
                texts, found = sentence_signals(ws, q["text"], pools[name].top(q["text"]), PASSAGE_CHARS)
                rows.append({"set": name, "answers": tuple(q["answers"]), "texts": texts, "signals": found})
    return rows


def answer_dev(ws, questions) -> list[dict]:
    """The dev questions of the answer benchmark: their sentences' signals (for the weights), and the signals of the
    same sentences as an answer quotes them (for "not found", as `Workspace.support` computes it)."""
    rows = []
    for q in questions:
        passages = ws.search(q.text, k=answers.K).candidates
        texts, found = sentence_signals(ws, q.text, passages)
        quoted = support.quoted_signals(q.text, ws.evidence(q.text, passages), ws._encoder())
        rows.append({"set": "answers" if q.kind in ("document", "man", "valgrind") else q.kind,
                     "answers": q.answers, "texts": texts, "signals": found, "quoted": quoted,
                     "answerable": q.answerable})
    return rows


def labels(row: dict) -> np.ndarray:
    return np.array([answer_in_context(row["answers"], [t]) == 1.0 for t in row["texts"]], dtype=float)


def fit_weights(rows: list[dict], signals: tuple[str, ...]) -> dict[str, float]:
    sizes: dict[str, int] = {}
    groups = []
    for row in rows:
        y = labels(row)
        if 0 < y.sum() < len(y):
            groups.append((np.column_stack([row["signals"][s] for s in signals]), y, row["set"]))
            sizes[row["set"]] = sizes.get(row["set"], 0) + 1

    def loss(w):
        total, gradient = L2 * w @ w, 2 * L2 * w
        for x, y, name in groups:
            values = x @ w
            e = np.exp(values - values.max())
            share = 1.0 / sizes[name]
            total -= share * np.log((e * y).sum() / e.sum())
            gradient += share * ((e / e.sum()) @ x - ((e * y) @ x) / (e * y).sum())
        return total, gradient

    w = minimize(loss, np.zeros(len(signals)), jac=True, method="L-BFGS-B").x
    return {name: round(float(v), 4) for name, v in zip(signals, w)}


SIGNAL_SETS = [("overlap",), ("overlap", "typed"), ("overlap", "cosine"), ("overlap", "typed", "cosine"),
               ("overlap", "typed", "cosine", "words")]
FOLDS = 5


def top_two_holds(row: dict, weights: dict[str, float]) -> float | None:
    best = np.argsort(-support.sentence_values(row["signals"], weights), kind="stable")[:2]
    return answer_in_context(row["answers"], [row["texts"][i] for i in best])


def cross_validated(rows: list[dict], signals: tuple[str, ...]) -> dict[str, float]:
    """Per question set, how often the two best sentences hold the gold answer, each fold's questions ranked by
    weights fitted on the other folds."""
    order = np.random.default_rng(0).permutation(len(rows))
    held: dict[str, list[float]] = {}
    for fold in range(FOLDS):
        tested = set(order[fold::FOLDS].tolist())
        weights = fit_weights([r for i, r in enumerate(rows) if i not in tested], signals)
        for i in tested:
            if (value := top_two_holds(rows[i], weights)) is not None:
                held.setdefault(rows[i]["set"], []).append(value)
    return {name: float(np.mean(values)) for name, values in sorted(held.items())}


def choose_signals(rows: list[dict]) -> tuple[tuple[str, ...], list[dict]]:
    table = [{"signals": signals, **cross_validated(rows, signals)} for signals in SIGNAL_SETS]
    for entry in table:
        entry["mean"] = float(np.mean([v for k, v in entry.items() if k != "signals"]))
    best = max(entry["mean"] for entry in table)
    chosen = min((e for e in table if e["mean"] >= best - 1e-9), key=lambda e: len(e["signals"]))
    return chosen["signals"], table


def fit_answered(rows: list[dict]) -> dict[str, float]:
    x = np.array([[r["quoted"]["overlap"].max(), r["quoted"]["cosine"].max()] for r in rows if r["texts"]])
    y = np.array([float(r["answerable"] and labels(r).any()) for r in rows if r["texts"]])

    def loss(w):
        logit = x @ w[:2] + w[2]
        p = 1 / (1 + np.exp(-logit))
        total = -np.sum(y * np.log(p + 1e-12) + (1 - y) * np.log(1 - p + 1e-12)) + L2 * w[:2] @ w[:2]
        gradient = np.r_[x.T @ (p - y) + 2 * L2 * w[:2], np.sum(p - y)]
        return total, gradient

    w = minimize(loss, np.zeros(3), jac=True, method="L-BFGS-B").x
    return {"overlap": round(float(w[0]), 4), "cosine": round(float(w[1]), 4), "bias": round(float(w[2]), 4)}


def choose_threshold(rows: list[dict], coefficients: dict[str, float]) -> tuple[float, list[dict]]:
    """The highest threshold (in steps of 0.01) that declines at most MAX_WRONG_DECLINES of the answerable dev
    questions; with the dev curve."""
    chance = [support.answered(r["quoted"], coefficients) if r["texts"] else 0.0 for r in rows]
    points = []
    for threshold in np.round(np.arange(0.0, 1.0001, 0.01), 2):
        wrong = np.mean([c < threshold for c, r in zip(chance, rows) if r["answerable"]])
        right = np.mean([c < threshold for c, r in zip(chance, rows) if not r["answerable"]])
        points.append({"threshold": float(threshold), "declined": float(right), "declined wrongly": float(wrong)})
    chosen = max(p["threshold"] for p in points if p["declined wrongly"] <= MAX_WRONG_DECLINES)
    return chosen, points


def main() -> None:
    ws, questions, _ = answers.build()
    dev = [q for q in questions if q.split == "dev"]
    answer_rows = answer_dev(ws, dev)
    fitted_on = qa_dev(ws) + [r for r in answer_rows if r["set"] == "answers" and r["answerable"]]
    signals, candidates = choose_signals(fitted_on)
    weights = fit_weights(fitted_on, signals)
    coefficients = fit_answered(answer_rows)
    threshold, points = choose_threshold(answer_rows, coefficients)
    counts = {name: sum(r["set"] == name for r in fitted_on) for name in ("hotpotqa", "tatqa", "answers")}
    model = {"weights": weights, "answered": coefficients, "abstain_below": threshold,
             "made_by": "python bench/fit_support.py", "date": date.today().isoformat(),
             "fitted_on": counts, "not_found_fitted_on": len(answer_rows)}
    support.MODEL_FILE.write_text(json.dumps(model, indent=1) + "\n")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fit.json").write_text(json.dumps({**model, "dev_curve": points, "signal_sets": candidates}, indent=1))
    (OUT / "fit.md").write_text(report(model, points, candidates))
    print(report(model, points, candidates))


def report(model: dict, points: list[dict], candidates: list[dict]) -> str:
    counts = model["fitted_on"]
    lines = ["# The `support` evidence scorer, fitted on dev questions", "",
             "Made by `python bench/fit_support.py` (the first half of `make bench-answers`); written to "
             "`src/gradfuse/rerank/support.json`. Sentence weights: a conditional logit over each question's "
             f"sentences, fitted on {counts['hotpotqa']} HotpotQA dev questions, {counts['tatqa']} TAT-QA dev questions "
             f"and {counts['answers']} dev questions of the answer benchmark over real documents (each set weighing the "
             "same), with the passages those benchmarks give them.", "",
             f"Which signals: {FOLDS}-fold cross-validation on those dev questions, each fold ranked by weights fitted "
             "on the others (the two best sentences hold the gold answer):", "",
             "| signals | answer benchmark | HotpotQA | TAT-QA | mean |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {' + '.join(c['signals'])} | {c['answers']:.3f} | {c['hotpotqa']:.3f} | {c['tatqa']:.3f} | "
              f"{c['mean']:.3f} |" for c in candidates]
    lines += ["", "The best mean, with the fewest signals where two tie, is chosen; its weights over all the dev "
              "questions (a sentence's value is the weighted sum):", "", "| signal | weight |", "|---|---:|"]
    lines += [f"| {name} | {value:+.3f} |" for name, value in model["weights"].items()]
    a = model["answered"]
    lines += ["", f"\"Not found\": the chance that the passages hold the answer is σ({a['bias']:+.2f} "
              f"{a['overlap']:+.2f} · best overlap {a['cosine']:+.2f} · best cosine), fitted on the "
              f"{model['not_found_fitted_on']} dev questions of the answer benchmark (answerable or not). The "
              f"threshold is the highest that declines at most {MAX_WRONG_DECLINES:.0%} of the answerable dev "
              f"questions: **{model['abstain_below']:.2f}** (`[evidence] abstain_below`).", "",
              "| threshold | no-answer dev questions declined | answerable declined wrongly |", "|---:|---:|---:|"]
    lines += [f"| {p['threshold']:.2f} | {p['declined']:.2f} | {p['declined wrongly']:.2f} |" for p in points
              if round(p["threshold"] * 100) % 5 == 0 or p["threshold"] == model["abstain_below"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
