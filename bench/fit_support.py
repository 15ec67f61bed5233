"""Fit the `support` evidence scorer (src/gradfuse/reading/support.py) and its "not found" model on material the
answer benchmark does not test, and show that both transfer: each is measured on a domain it was not fitted on
(the first half of `make bench-answers`).

Question sets (domains), each question with the five passages its corpus's dense prior (MiniLM cosine over the
whole corpus) ranks first, whole, and again with its judged passages left out (a pool that usually does not hold
the answer, made from the same corpus: near misses by construction):
- tatqa: TAT-QA's dev span answers from text, over its report paragraphs;
- hotpotqa: HotpotQA's first 20 questions (the QA benchmark's dev; its test and the answer benchmark draw from the
  other 80), over its paragraphs;
- pubmedqa: PubMedQA questions the answer benchmark does not use, over its abstracts, for "not found" only (its
  answers are yes or no: a pool holds the answer when it holds the question's abstract);
- answers: the dev third of the answer benchmark (`bench/answers.py`), with the default method's passages; its
  HotpotQA and TAT-QA questions come from those sets' test questions and are left out of the sentence fit;
- written: the reader's written test questions (`training/reader_questions.json`, over man pages, Node.js' API
  and pydoc pages no benchmark reads; only the files the reader never trained on), a fifth of them near misses,
  each with the five chunks of its domain that the dense prior ranks first.

A sentence holds the answer when the gold answer string stands in it; a pool holds it when one of its sentences
does (pubmedqa: when it holds the question's abstract). Sentence weights: a conditional logit over each question's
sentences, L2-regularised, each set weighing the same, over the signals chosen by greedy forward selection on
leave-one-set-out: a signal is added while it raises the mean, over the held-out sets, of how often the two
sentences an answer quotes hold the gold answer, by at least a point, and lowers none of the sets by more; the
selection ships only where it beats plain overlap (the share of the question's words, nothing weighed) on every
set left out, else plain overlap ships (issue 70). "Not found": a logistic model, each set
weighing the same, over the features of `ANSWERED_SETS` whose leave-one-set-out rows gain most (no-answer pools
declined less answerable ones declined, on the set left out, with the model and threshold fitted on the others);
its threshold is the highest at which no set's answerable pools are declined more than 10% of the time. Writes src/gradfuse/reading/support.json and results/answers/fit.{md,json}.

    python bench/fit_support.py
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import sys
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import answers  # noqa: E402

from gradfuse.candidate import Candidate  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.eval.qa import answer_in_context, checkable  # noqa: E402
from gradfuse.reading.evidence import Evidence, passage_sentences, quoted_first  # noqa: E402
from gradfuse.reading.reader import READER_FILE, read  # noqa: E402
from gradfuse.reading import support  # noqa: E402

OUT = answers.OUT
CACHE = answers.WORK / "fit"
DATA = answers.DATA
POOL = answers.K
MAX_WRONG_DECLINES = 0.10  # of answerable pools, in every set
L2 = 0.01
MIN_GAIN = 0.01  # a signal is added only if it raises the held-out mean this much and lowers no set by more
# (the sets are small: HotpotQA's dev has 12 pools that hold its answer, the answer benchmark's 15)
PUBMED_QUESTIONS = 200
SENTENCE_SETS = ("tatqa", "hotpotqa", "answers", "written")
ANSWER_SETS = ("tatqa", "hotpotqa", "pubmedqa", "answers", "written")
# The reader's signal is tried where `make train-reader` has made one (reading/READER.md).
READER = READER_FILE.is_file()
SIGNALS = support.SIGNALS if READER else tuple(s for s in support.SIGNALS if s != "reader")
WRITTEN = answers.ROOT / "training" / "reader_questions.json"
SENTENCES_BEFORE = {"overlap": 7.2373}  # the sentence weights shipped on 2026-12-02 (with answers.NOT_FOUND_BEFORE)


@dataclass
class Pool:
    """One question's sentences (as an answer quotes them, in their passages' order) and what holds its answer."""
    set: str
    question: str
    texts: list[str]
    passages: list[int]
    cosines: np.ndarray
    holds: np.ndarray  # per sentence: the gold answer stands in it (all False where no string can be checked)
    spans: list[tuple[int, int]]  # per sentence: its characters in its passage
    answerable: bool  # the pool holds the answer
    near_miss: bool = False  # a written no-answer question over the benchmark's own sources
    fit_sentences: bool = True  # used for the sentence weights
    query: np.ndarray | None = None  # the question's vector
    vectors: np.ndarray | None = None  # its sentences' vectors
    features: dict | None = None  # support.signals of its sentences (computed after loading, never cached)
    reader: np.ndarray | None = None  # the reader's logit of each sentence (reading/reader.py)


class Embedded:
    """The encoder with a memory: a sentence in two pools is encoded once."""

    def __init__(self, encoder):
        self.encoder, self.vectors = encoder, {}

    def vectors_of(self, question: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The question's vector and the sentences' (one row each)."""
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if new:
            self.vectors.update(zip(new, self.encoder.encode_short(new)))
        query = self.encoder.encode_query(question)
        return query, np.stack([self.vectors[t] for t in texts]) if texts else np.zeros((0, len(query)))


def make_pool(embedded: Embedded, name: str, question: str, answers_: tuple[str, ...], passages: list[Candidate],
              answerable: bool | None = None, **extra) -> Pool:
    evidence = [Evidence.of(number, c, span, 0.0) for number, c in enumerate(passages, start=1)
                for span in passage_sentences(c, c.text)]
    texts = [e.quoted() for e in evidence]
    holds = np.array([bool(answers_) and answer_in_context(answers_, [t]) == 1.0 for t in texts], dtype=bool)
    query, vectors = embedded.vectors_of(question, texts)
    cosines = vectors @ query
    overlap = support.signals(question, texts, cosines, [e.passage for e in evidence], only=("overlap",))["overlap"]
    reader = read(question, texts, overlap, cosines) if READER else None
    return Pool(name, question, texts, [e.passage for e in evidence], cosines, holds, [e.span for e in evidence],
                bool(holds.any()) if answerable is None else answerable, query=query.astype(np.float32),
                vectors=vectors.astype(np.float32), reader=reader, **extra)


class Corpus:
    """One data set's documents and their vectors (kept in CACHE), ranked for a question, some left out."""

    def __init__(self, name: str, folder: str, encoder, keep=lambda record: True):
        self.name, self.encoder = name, encoder
        self.records = [r for r in answers.read_jsonl(DATA / folder / "corpus.jsonl") if keep(r)]
        path = CACHE / f"{name}.npy"
        if path.exists():
            self.vectors = np.load(path)
        else:
            self.vectors = encoder.encode([f"{r.get('title', '')}\n{r['text']}" for r in self.records])
            CACHE.mkdir(parents=True, exist_ok=True)
            np.save(path, self.vectors)

    def top(self, question: str, leave_out: frozenset = frozenset()) -> list[Candidate]:
        order = np.argsort(-(self.vectors @ self.encoder.encode_query(question)), kind="stable")
        kept = [i for i in order[: POOL + len(leave_out)] if self.records[i]["id"] not in leave_out][:POOL]
        return [Candidate(self.name, self.records[i]["id"], self.records[i]["text"], 0.0, rank,
                          title=self.records[i].get("title", "")) for rank, i in enumerate(kept, start=1)]


def qa_pools(embedded: Embedded) -> list[Pool]:
    encoder = embedded.encoder
    used = {q.id.split(":", 1)[1] for q in answers.drawn_questions()[2]}  # PubMedQA's in the answer benchmark
    pools = []
    tatqa = Corpus("tatqa", "tatqa_hybrid", encoder, keep=lambda r: r["id"].startswith("text/"))
    judged = answers.read_qrels(DATA / "tatqa_hybrid" / "qrels.tsv")
    for q in answers.read_jsonl(DATA / "tatqa_hybrid" / "queries.jsonl"):
        if q["split"] == "dev" and q["answer_type"] == "span" and q["answer_from"] == "text" \
                and checkable(tuple(q["answers"])):
            gold = frozenset(d for d in judged.get(q["id"], ()) if d.startswith("text/"))
            for leave_out in (frozenset(), gold):
                pools.append(make_pool(embedded, "tatqa", q["text"], tuple(q["answers"]), tatqa.top(q["text"], leave_out)))
    hotpot = Corpus("hotpotqa", "hotpotqa_train100_hipporag", encoder)
    judged = answers.read_qrels(DATA / "hotpotqa_train100_hipporag" / "qrels.tsv")
    # The first 20 only: the QA benchmark tests on the rest (and the answer benchmark draws from them).
    for q in answers.read_jsonl(DATA / "hotpotqa_train100_hipporag" / "queries.jsonl")[:20]:
        if checkable(tuple(q["answers"])):
            for leave_out in (frozenset(), frozenset(judged.get(q["id"], ()))):
                pools.append(make_pool(embedded, "hotpotqa", q["text"], tuple(q["answers"]),
                                       hotpot.top(q["text"], leave_out)))
    pubmed = Corpus("pubmedqa", "pubmedqa_pqal", encoder)
    questions = [q for q in answers.read_jsonl(DATA / "pubmedqa_pqal" / "queries.jsonl") if q["id"] not in used]
    for q in random.Random(answers.SEED).sample(questions, PUBMED_QUESTIONS):
        for leave_out in (frozenset(), frozenset({q["id"]})):
            passages = pubmed.top(q["text"], leave_out)
            pools.append(make_pool(embedded, "pubmedqa", q["text"], (), passages,
                                   answerable=any(c.doc_id == q["id"] for c in passages), fit_sentences=False))
    return pools


def written_pools(embedded: Embedded) -> list[Pool]:
    """The reader's written test questions (training/reader_questions.json: files it never trained on), each with
    the five chunks of its domain's pages (man pages, Node.js' API, pydoc) that the dense prior ranks first: pages
    neither the answer benchmark nor the demo reads, a fifth of the questions near misses with no answer."""
    sys.path.insert(0, str(answers.ROOT / "training"))
    import reader_data

    items, test = reader_data.written_questions()
    pools = []
    for domain in reader_data.TECHNICAL:
        chunks = [c for _, file in sorted(reader_data.domain_chunks(domain).items()) for c in file]
        path = CACHE / f"written-{domain}-{len(chunks)}.npy"
        if path.exists():
            vectors = np.load(path)
        else:
            vectors = embedded.encoder.encode([c.text for c in chunks])
            CACHE.mkdir(parents=True, exist_ok=True)
            np.save(path, vectors)
        for q in items:
            if q["domain"] == domain and (domain, q["file"]) in test:
                order = np.argsort(-(vectors @ embedded.encoder.encode_query(q["question"])), kind="stable")[:POOL]
                answerable = q["kind"] == "answerable"
                pools.append(make_pool(embedded, "written", q["question"], (q["answer"],) if answerable else (),
                                       [replace(chunks[i], native_rank=rank) for rank, i in enumerate(order, start=1)],
                                       answerable=None if answerable else False, near_miss=not answerable))
    return pools


def answer_pools(embedded: Embedded, ws, questions) -> list[Pool]:
    pools = []
    for q in questions:
        if q.split == "dev":
            passages = ws.search(q.text, k=POOL).candidates
            own = q.kind in ("document", "man", "valgrind")
            pools.append(make_pool(embedded, "answers", q.text, q.answers, passages,
                                   answerable=None if q.answerable else False, near_miss=q.near_miss,
                                   fit_sentences=own))
    return pools


QA_POOLS_VERSION = 3  # raise when qa_pools changes: its pools are kept in CACHE between runs


def gathered() -> list[Pool]:
    """Every pool; the QA sets' from CACHE once made, the answer benchmark's anew (its questions change)."""
    ws, questions, _ = answers.build()
    embedded = Embedded(ws.query.encoder())
    reader = hashlib.sha256(READER_FILE.read_bytes()).hexdigest()[:12] if READER else "none"  # pools keep its logits
    path = CACHE / f"qa-pools-{QA_POOLS_VERSION}-{reader}.pkl"
    if path.exists():
        qa = pickle.loads(path.read_bytes())
    else:
        qa = qa_pools(embedded)
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(qa))
    path = CACHE / f"written-pools-{reader}-{hashlib.sha256(WRITTEN.read_bytes()).hexdigest()[:12]}.pkl"
    if path.exists():
        written = pickle.loads(path.read_bytes())
    else:
        written = written_pools(embedded)
        path.write_bytes(pickle.dumps(written))
    return answer_pools(embedded, ws, questions) + qa + written


def found(pool: Pool) -> dict[str, np.ndarray]:
    return support.signals(pool.question, pool.texts, pool.cosines, pool.passages, only=SIGNALS, reader=pool.reader)


def fit_weights(pools: list[Pool], signals: tuple[str, ...]) -> dict[str, float]:
    groups, sizes = [], {}
    for pool in pools:
        if pool.fit_sentences and 0 < pool.holds.sum() < len(pool.holds):
            x = np.column_stack([pool.features[s] for s in signals])
            groups.append((x, pool.holds.astype(float), pool.set))
            sizes[pool.set] = sizes.get(pool.set, 0) + 1

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


def quoted_holds(pool: Pool, weights: dict[str, float], within: float | None = None) -> bool:
    """Whether the sentences an extractive answer would quote (`quoted_first` of the best) hold the gold answer."""
    values = support.sentence_values(pool.features, weights)
    ranked = [Evidence(pool.passages[i], pool.set, "", pool.spans[i], pool.texts[i], float(values[i]))
              for i in np.argsort(-values, kind="stable")]
    quoted = {e.text for quote in quoted_first(ranked, within=within, question=pool.question) for e in quote}
    return any(h for t, h in zip(pool.texts, pool.holds) if t in quoted)


def sentence_score(pools: list[Pool], weights: dict[str, float], name: str) -> float:
    held = [quoted_holds(p, weights) for p in pools if p.set == name and p.fit_sentences and p.holds.any()]
    return float(np.mean(held)) if held else float("nan")


GAPS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)
MAX_LOST = 0.01  # of the sentence-fit pools holding the answer: what dropping far second sentences may cost


def choose_gap(pools: list[Pool], weights: dict[str, float]) -> tuple[float | None, list[dict]]:
    """The smallest gap between the first and a second quoted sentence's values at which the quoted answers
    holding the gold answer fall by at most MAX_LOST (every sentence-fit pool holding it); with the table."""
    held = [p for p in pools if p.fit_sentences and p.holds.any()]
    always = np.mean([quoted_holds(p, weights) for p in held])
    table = []
    for gap in GAPS:
        ranked = [np.sort(support.sentence_values(p.features, weights))[::-1] for p in held]
        table.append({"gap": gap, "quoted": float(np.mean([quoted_holds(p, weights, gap) for p in held])),
                      "one sentence": float(np.mean([len(v) > 1 and v[0] - v[1] > gap for v in ranked]))})
    chosen = next((row["gap"] for row in table if round(always - row["quoted"], 6) <= MAX_LOST), None)
    return chosen, [{"gap": None, "quoted": float(always), "one sentence": 0.0}, *table]


def leave_one_set_out(pools: list[Pool], signals: tuple[str, ...]) -> dict[str, float]:
    return {name: sentence_score(pools, fit_weights([p for p in pools if p.set != name], signals), name)
            for name in SENTENCE_SETS}


def beats_plain(selected: dict[str, float], plain: dict[str, float]) -> bool:
    """Whether the selected signals beat plain overlap on every set left out of their fit (else plain ships)."""
    return all(selected[n] > plain[n] for n in SENTENCE_SETS)


STEP = "signals, step "  # a row of the selection: every trial of one step (the one taken marked)
NOT_FOUND = "not found: "  # a row of the "not found" models: each set measured with a model fitted on the others


def choose_signals(pools: list[Pool], results: ResultsFile) -> tuple[str, ...]:
    """Greedy forward selection on the leave-one-set-out mean, from nothing, while a signal adds MIN_GAIN to the mean
    and takes no more than MIN_GAIN from any set; each step's trials (the one taken marked) a row of `results`."""
    chosen: tuple[str, ...] = ()
    best, before = -1.0, None
    for step in range(1, len(SIGNALS) + 1):
        trials = []
        for signal in SIGNALS:
            if signal not in chosen:
                scores = leave_one_set_out(pools, (*chosen, signal))
                harmless = before is None or all(scores[n] >= before[n] - MIN_GAIN for n in SENTENCE_SETS)
                trials.append({"step": step, "signals": (*chosen, signal), **scores,
                               "mean": float(np.mean(list(scores.values()))), "harmless": harmless, "taken": False})
        taken = max((t for t in trials if t["harmless"]), key=lambda t: t["mean"], default=None)
        joins = taken is not None and taken["mean"] >= best + MIN_GAIN
        if joins:
            taken["taken"] = True
        results.add(f"{STEP}{step}", {"trials": trials})
        if not joins:
            break
        chosen, best, before = taken["signals"], taken["mean"], {n: taken[n] for n in SENTENCE_SETS}
        print(f"signals {chosen}: {best:.3f}", file=sys.stderr, flush=True)
    return chosen


def answer_features(pool: Pool, weights: dict[str, float]) -> dict[str, float]:
    if not pool.texts:
        return {name: 0.0 for name in support.ANSWERED}
    return support.answered_features(pool.features, weights)


def fit_answered(pools: list[Pool], weights: dict[str, float], names: tuple[str, ...]) -> dict[str, float]:
    x = np.array([[answer_features(p, weights)[n] for n in names] for p in pools])
    y = np.array([float(p.answerable) for p in pools])
    sizes = {}
    for p in pools:
        sizes[p.set] = sizes.get(p.set, 0) + 1
    share = np.array([len(pools) / len(sizes) / sizes[p.set] for p in pools])
    scale = x.std(axis=0) + 1e-9

    def loss(w):
        logit = (x / scale) @ w[:-1] + w[-1]
        p = 1 / (1 + np.exp(-logit))
        total = -np.sum(share * (y * np.log(p + 1e-12) + (1 - y) * np.log(1 - p + 1e-12))) + L2 * w[:-1] @ w[:-1]
        gradient = np.r_[(x / scale).T @ (share * (p - y)) + 2 * L2 * w[:-1], np.sum(share * (p - y))]
        return total, gradient

    w = minimize(loss, np.zeros(len(names) + 1), jac=True, method="L-BFGS-B").x
    return {**{n: round(float(v / s), 4) for n, v, s in zip(names, w[:-1], scale)}, "bias": round(float(w[-1]), 4)}


def chances(pools: list[Pool], model: support.SupportModel) -> np.ndarray:
    return np.array([support.answered(p.features, model) if p.texts else 0.0 for p in pools])


def curve(pools: list[Pool], chance: np.ndarray, threshold: float) -> dict[str, float]:
    declined = chance < threshold
    answerable = np.array([p.answerable for p in pools])
    near = np.array([p.near_miss for p in pools])
    share = (lambda mask: float(declined[mask].mean()) if mask.any() else float("nan"))
    return {"declined": share(~answerable), "declined wrongly": share(answerable), "near misses": share(near),
            "answerable": int(answerable.sum()), "no answer": int((~answerable).sum())}


def choose_threshold(pools: list[Pool], chance: np.ndarray) -> float:
    """The highest threshold (steps of 0.01) at which no set declines more than the limit of its answerable pools:
    a threshold must hold on every source it was fitted on (the median over sets reaches further on the answer
    benchmark's dev questions, and declines most of the demo's answerable questions: docs/answers.md)."""
    names = sorted({p.set for p in pools})

    def wrong(threshold):
        rates = [curve([p for p in pools if p.set == n], chance[[p.set == n for p in pools]], threshold)
                 ["declined wrongly"] for n in names]
        return float(np.nanmax(rates))

    return max(t for t in np.round(np.arange(0.0, 1.0001, 0.01), 2) if wrong(t) <= MAX_WRONG_DECLINES)


ANSWERED_SETS = (("overlap", "cosine"), ("cosine", "passage"), ("overlap", "cosine", "passage"),
                 ("best", "overlap", "cosine", "passage", "margin"), ("reader",), ("reader", "overlap", "cosine"),
                 ("best", "reader", "overlap", "cosine", "passage", "margin"))


def transfer(pools: list[Pool], weights: dict[str, float], names: tuple[str, ...]) -> list[dict]:
    """For each set: "not found" fitted (model and threshold) on the others, measured on it."""
    rows = []
    for name in ANSWER_SETS:
        trained = [p for p in pools if p.set != name]
        tested = [p for p in pools if p.set == name]
        model = support.SupportModel(weights, fit_answered(trained, weights, names), 0.0)
        threshold = choose_threshold(trained, chances(trained, model))
        rows.append({"set": name, "model": " + ".join(names), "threshold": float(threshold),
                     **curve(tested, chances(tested, model), threshold)})
    return rows


def before(pools: list[Pool]) -> list[dict]:
    """"Not found" as shipped before (`answers.NOT_FOUND_BEFORE`, its cosine over every sentence), on each set."""
    threshold = answers.NOT_FOUND_BEFORE["abstain_below"]
    rows = []
    for name in ANSWER_SETS:
        tested = [p for p in pools if p.set == name]
        chance = np.array([answers.chance_before(p.features) if p.texts else 0.0 for p in tested])
        rows.append({"set": name, "model": f"before (overlap and cosine, {threshold})", "threshold": threshold,
                     **curve(tested, chance, threshold)})
    return rows


def choose_answered(pools: list[Pool], weights: dict[str, float], results: ResultsFile) -> tuple[str, ...]:
    """The feature set whose held-out sets gain most (no-answer declined less answerable declined, mean over sets);
    each feature set's held-out rows, then those of the model shipped before, a row of `results`."""
    gains = {}
    for names in (n for n in ANSWERED_SETS if READER or "reader" not in n):
        held = transfer(pools, weights, names)
        gains[names] = float(np.mean([r["declined"] - r["declined wrongly"] for r in held]))
        results.add(NOT_FOUND + " + ".join(names), {"gain": gains[names], "transfer": held})
    results.add(NOT_FOUND + "before", {"transfer": before(pools)})
    return max(gains, key=gains.get)


def main() -> None:
    pools = gathered()
    for pool in pools:
        pool.features = found(pool)
    counts = {name: {"pools": sum(p.set == name for p in pools),
                     "sentence fit": sum(bool(p.set == name and p.fit_sentences and 0 < p.holds.sum() < len(p.holds))
                                         for p in pools)} for name in ANSWER_SETS}
    results = ResultsFile.start(OUT, "python bench/fit_support.py", name="fit", signals=list(SIGNALS),
                                fitted_on=counts)
    selected = choose_signals(pools, results)
    held_out = {"selected": leave_one_set_out(pools, selected), "plain overlap": leave_one_set_out(pools, ("plain",)),
                "overlap (before)": {n: sentence_score(pools, SENTENCES_BEFORE, n) for n in SENTENCE_SETS},
                "cosine": leave_one_set_out(pools, ("cosine",))}
    signals = selected if beats_plain(held_out["selected"], held_out["plain overlap"]) else ("plain",)
    weights = fit_weights(pools, signals)
    within, gaps = choose_gap(pools, weights)
    names = choose_answered(pools, weights, results)
    coefficients = fit_answered(pools, weights, names)
    model = support.SupportModel(weights, coefficients, 0.0)
    chance = chances(pools, model)
    threshold = choose_threshold(pools, chance)
    per_set = {name: [{"threshold": float(t), **curve([p for p in pools if p.set == name],
                                                      chance[[p.set == name for p in pools]], t)}
                      for t in np.round(np.arange(0.0, 1.0001, 0.05), 2)] for name in ANSWER_SETS}
    stored = {"weights": weights, "selected": list(selected), "answered": coefficients, "abstain_below": float(threshold), "second_within": within,
              "made_by": "python bench/fit_support.py", "date": date.today().isoformat(), "fitted_on": counts}
    support.MODEL_FILE.write_text(json.dumps(stored, indent=1) + "\n")
    results.header.update(stored, held_out=held_out, per_set=per_set, gaps=gaps)
    results.finish(report(results))
    print(report(results))


def rows_of(results: ResultsFile, kind: str, key: str) -> list[dict]:
    """The entries under `key` of the rows whose names start with `kind` (STEP, NOT_FOUND), in the order they came."""
    return [entry for name, row in results.rows.items() if name.startswith(kind) for entry in row[key]]


def report(results: ResultsFile) -> str:
    """The page, from what the results file holds so far: a run stopped half-way shows the steps it finished."""
    header = results.header
    lines = opening(results) + selection_table(results)
    if "weights" in header:
        lines += fitted(header)
    lines += transfer_table(results)
    if "per_set" in header:
        lines += ["", "The shipped model's curve per set (no-answer declined / answerable declined wrongly):", "",
                  "| threshold | " + " | ".join(ANSWER_SETS) + " |", "|---:|" + "---|" * len(ANSWER_SETS)]
        per_set = header["per_set"]
        for i, point in enumerate(per_set[ANSWER_SETS[0]]):
            lines.append(f"| {point['threshold']:.2f} | " + " | ".join(
                f"{per_set[n][i]['declined']:.2f} / {per_set[n][i]['declined wrongly']:.2f}" for n in ANSWER_SETS)
                + " |")
    return "\n".join(lines) + "\n"


def opening(results: ResultsFile) -> list[str]:
    counts = results.header["fitted_on"]
    return ["# The `support` evidence scorer and \"not found\", fitted away from the test questions", "",
            f"{results.provenance} It is the first half of `make bench-answers` and writes "
            "`src/gradfuse/reading/support.json`. Pools (a question's five passages: its corpus's dense prior's, or "
            "the default method's for the answer benchmark; the QA sets' again with the judged passages left out), "
            "per set: "
            + ", ".join(f"{n} {c['pools']} ({c['sentence fit']} in the sentence fit)" for n, c in counts.items())
            + ". A sentence holds the answer when the gold string stands in it.", ""]


def selection_table(results: ResultsFile) -> list[str]:
    lines = ["Signals, by greedy forward selection on leave-one-set-out (the quotes of an answer hold the gold answer, "
             "on the set left out; a signal joins when it adds a point to the mean and takes no more than a point from "
             "any set; every trial of every step):", "",
             "| step | signals | " + " | ".join(SENTENCE_SETS) + " | mean |", "|---:|---|" + "---:|" * (len(SENTENCE_SETS) + 1)]
    for trial in rows_of(results, STEP, "trials"):
        mark = " (taken)" if trial["taken"] else "" if trial["harmless"] else " (lowers a set)"
        lines.append(f"| {trial['step']} | {' + '.join(trial['signals'])}{mark} | "
                     + " | ".join(f"{trial[n]:.3f}" for n in SENTENCE_SETS) + f" | {trial['mean']:.3f} |")
    return lines


def fitted(fit: dict) -> list[str]:
    """What the run fitted (in the header once it is done): the sentence value held out, its weights, the gap to a
    second quoted sentence and the "not found" model."""
    shipped = " + ".join(fit["weights"])
    verdict = ("are plain overlap itself, and ship" if fit["selected"] == ["plain"] else
               "beat plain overlap on every set left out, and ship" if list(fit["weights"]) == fit["selected"] else
               f"do not beat plain overlap on every set left out: **{shipped}** ships")
    lines = ["", f"Held out: the signals selected ({' + '.join(fit['selected'])}) {verdict}; beside them plain "
             "overlap, the sentence value shipped before issue 57 (overlap alone) and cosine alone:", "",
             "| sentence value | " + " | ".join(SENTENCE_SETS) + " | mean |",
             "|---|" + "---:|" * (len(SENTENCE_SETS) + 1)]
    for name, scores in fit["held_out"].items():
        lines.append(f"| {name} | " + " | ".join(f"{scores[n]:.3f}" for n in SENTENCE_SETS)
                     + f" | {np.nanmean(list(scores.values())):.3f} |")
    lines += ["", "Weights over every set (a sentence's value is the weighted sum):", "", "| signal | weight |", "|---|---:|"]
    lines += [f"| {name} | {value:+.3f} |" for name, value in fit["weights"].items()]
    lines += ["", "A second sentence is quoted only when its value is within a gap of the first's; the smallest gap that "
              f"costs at most {MAX_LOST:.0%} of the quoted answers holding the gold answer is kept: "
              f"**{fit['second_within']}** (pools whose passages hold the answer):", "",
              "| gap | quoted answer holds the gold answer | answers quoting one sentence |", "|---:|---:|---:|"]
    lines += [f"| {'none' if g['gap'] is None else g['gap']} | {g['quoted']:.3f} | {g['one sentence']:.2f} |"
              for g in fit["gaps"]]
    a = fit["answered"]
    return lines + ["", "\"Not found\": the chance that the passages hold the answer is σ(" + f"{a['bias']:+.2f} "
                    + " ".join(f"{v:+.2f} · {n}" for n, v in a.items() if n != "bias")
                    + f"), with `support.ANSWERED`'s features; threshold **{fit['abstain_below']:.2f}** "
                    "(`[evidence] abstain_below`), the highest at which no set's answerable pools are declined more "
                    f"than {MAX_WRONG_DECLINES:.0%} of the time."]


def transfer_table(results: ResultsFile) -> list[str]:
    lines = ["", "Does a threshold fitted on some sources hold on others? Each set measured with the model and "
             "threshold fitted on the other three, for each feature set (the one whose rows gain most is shipped: "
             "declined less declined wrongly, mean over sets); and the model shipped before, as it was:", "",
             "| set left out | model | threshold | no-answer pools declined | answerable declined wrongly | "
             "near misses declined | answerable | no answer |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows_of(results, NOT_FOUND, "transfer"):
        lines.append(f"| {row['set']} | {row['model']} | {row['threshold']:.2f} | {row['declined']:.2f} | "
                     f"{row['declined wrongly']:.2f} | " + ("–" if np.isnan(row["near misses"]) else
                                                          f"{row['near misses']:.2f}")
                     + f" | {row['answerable']} | {row['no answer']} |")
    return lines


if __name__ == "__main__":
    main()
