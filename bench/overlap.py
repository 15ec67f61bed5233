"""Stage 1 where sources overlap (issue 60): do redundancy-aware selection and the passage-level baselines keep the
top k free of copies, and find both passages a two-passage question needs?

Collections, from ../shared/data: HotpotQA (two paragraphs a question, judged by their supporting sentences),
TAT-QA's table-and-text questions (a table and a paragraph), and SciFact (one abstract, mostly). Each collection is
two disjoint sources (HotpotQA and SciFact halved by a hash of the id; TAT-QA's tables and its paragraphs), beside
two disjoint distractors (Cranfield, 2,000 ArguAna arguments). Then one overlap kind at a time, as users' sources
overlap, each a row:

- `disjoint`: no overlap (what every other benchmark here measures);
- `mirror`: the first half again, in LanceDB (an engine holding the same rows and vectors);
- `near duplicate`: the first half again, cut differently (windows of two sentences, lines wrapped as a PDF export
  is), so no copy is the same text;
- `versions`: the first half again with 30% of its passages edited (a number changed, a sentence added);
- `aggregator`: a digest holding 30% of every other source's passages;
- `all`: the four at once (a team drive that copies the others).

Every method ranks the same candidates of each question (30 from each source, hybrid retrieval): `select` with
relevance only (the default, lambda 0) and with the redundancy weight tuned on the dev questions, for each measure
of redundancy (`similarity`, the method's, and `copies`: gradfuse.selection); `dense` (cosine over
every source's candidates, the strongest cheap baseline); RRF; concatenation; dense followed by MMR over passages
(its weight tuned on dev); dense with near-duplicate passages dropped (cosine >= 0.95 to a better one). Routing rows
send each question to 3 sources by their summaries, with and without routing's redundancy weight, then `select`.

Measures (ms: the retrieval's and the method's own ranking, or the whole search for the routing rows): complete
evidence@k (every gold unit of the question in the top k: a supporting sentence for HotpotQA, a
document otherwise; a copy counts where it holds the unit), distinct gold units in the top 10, passages in the top
10 that repeat a better one (>= 80% of the shorter one's runs of three words in the other), nDCG@10 over original documents (a copy counted once),
answer recall (the quoted answer, made from the top 5 as `gradfuse ask` makes it, holds a gold answer; HotpotQA and
TAT-QA), sources asked and ms p50. Paired randomisation tests on complete evidence@5 against relevance-only.

Run: make bench-overlap (results/overlap/; about 40 min on two cores). `--questions N` takes fewer questions a
collection, for a look (written under .gradfuse/bench/overlap/look).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from gradfuse import SourceSpec, Workspace  # noqa: E402
from gradfuse.candidate import Candidate  # noqa: E402
from gradfuse.config import load_config  # noqa: E402
from gradfuse.embedding.encoder import EmbeddingCache, embedding_text, load_encoder  # noqa: E402
from gradfuse.eval.qa import answer_in_context  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.eval.stats import mean_interval, paired_difference  # noqa: E402
from gradfuse.reading.evidence import extractive_answer  # noqa: E402
from gradfuse.selection import SelectionSettings  # noqa: E402
from gradfuse.selection.routing import RoutingSettings  # noqa: E402

DATA = Path(os.environ.get("GRADFUSE_DATA") or ROOT.parent / "shared" / "data")
WORK = ROOT / ".gradfuse" / "bench" / "overlap"
OUT = ROOT / "results" / "overlap"
DEPTH = 30  # candidates asked of each source
KINDS = ("disjoint", "mirror", "near duplicate", "versions", "aggregator", "all")
COPIES = {"mirror": "mirror", "near duplicate": "pdf", "versions": "v2", "aggregator": "digest"}
LAMBDAS = (0.25, 0.5, 1.0, 2.0, 4.0)  # select's redundancy weights tried on dev, with each measure
MEASURES = ("similarity", "copies")  # gradfuse.selection.REDUNDANCY_MEASURES
RELEVANCE_ONLY = "select, relevance only"
MMR_WEIGHTS = (0.5, 0.7, 0.85)  # MMR's relevance weight tried on dev
ROUTING_LAMBDAS = (0.5, 1.0, 2.0)
DUPLICATE_COSINE = 0.95  # dense with near duplicates dropped: a passage this close to a better one is dropped
REPEAT_CONTAINMENT = 0.8  # a passage whose runs of three words are this much inside a better one's repeats it
EDITED_SHARE, DIGEST_SHARE = 0.3, 0.3
QUESTIONS = {"hotpotqa": (40, 60), "tatqa": (60, 150), "scifact": (60, 150)}  # (dev, test) a collection


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    collection: str
    split: str  # dev | test
    units: tuple[tuple[str, str | None], ...]  # (original document, its supporting sentence or None: the document)
    answers: tuple[str, ...] = ()

    @property
    def two_passage(self) -> bool:
        return len({document for document, _ in self.units}) >= 2


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _qrels(path: Path) -> dict[str, list[str]]:
    judged: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        query, document, *rest = line.split("\t")
        if int(rest[-1]) > 0:
            judged.setdefault(query, []).append(document)
    return judged


def _half(document_id: str) -> str:
    return "a" if hashlib.md5(document_id.encode()).digest()[0] % 2 == 0 else "b"


def _sample(rows: list, count: int, seed: int) -> list:
    return random.Random(seed).sample(rows, min(count, len(rows)))


def hotpotqa() -> tuple[dict[str, list[dict]], list[Question]]:
    folder = DATA / "hotpotqa_train100_hipporag"
    corpus = {r["id"]: r for r in _rows(folder / "corpus.jsonl")}
    spans = {r["id"]: r["spans"] for r in _rows(folder / "sentences.jsonl")}
    facts: dict[str, list[tuple[str, str]]] = {}
    for line in (folder / "qrels_sentences.tsv").read_text().splitlines():
        query, document, index, _ = line.split("\t")
        start, end = spans[document][int(index)]
        facts.setdefault(query, []).append((document, corpus[document]["text"][start:end].strip()))
    queries = _rows(folder / "queries.jsonl")
    dev_count, test_count = QUESTIONS["hotpotqa"]
    order = _sample(queries, len(queries), 0)[:dev_count + test_count]
    questions = [Question(q["id"], q["text"], "hotpotqa", "dev" if i < dev_count else "test",
                          tuple(facts[q["id"]]), tuple(q["answers"])) for i, q in enumerate(order)]
    sources = {f"hotpotqa-{half}": [r for r in corpus.values() if _half(r["id"]) == half] for half in "ab"}
    return sources, questions


def tatqa() -> tuple[dict[str, list[dict]], list[Question]]:
    folder = DATA / "tatqa_hybrid"
    corpus = _rows(folder / "corpus.jsonl")
    judged = _qrels(folder / "qrels.tsv")
    questions = []
    for split, count in zip(("dev", "test"), QUESTIONS["tatqa"]):
        both = [q for q in _rows(folder / "queries.jsonl") if q["answer_from"] == "table-text" and q["split"] == split]
        questions += [Question(q["id"], q["text"], "tatqa", split, tuple((d, None) for d in judged[q["id"]]),
                               tuple(q["answers"])) for q in _sample(both, count, 0)]
    sources = {"tatqa-a": [r for r in corpus if r["source"] == "table"],
               "tatqa-b": [r for r in corpus if r["source"] == "text"]}
    return sources, questions


def scifact() -> tuple[dict[str, list[dict]], list[Question]]:
    folder = DATA / "beir_scifact"
    corpus = _rows(folder / "corpus.jsonl")
    dev_count, test_count = QUESTIONS["scifact"]
    questions = []
    for split, queries, qrels, count in (("dev", "queries_train.jsonl", "qrels_train.tsv", dev_count),
                                         ("test", "queries.jsonl", "qrels.tsv", test_count)):
        judged = _qrels(folder / qrels)
        rows = [q for q in _rows(folder / queries) if q["id"] in judged]
        questions += [Question(q["id"], q["text"], "scifact", split, tuple((d, None) for d in judged[q["id"]]))
                      for q in _sample(rows, count, 0)]
    sources = {f"scifact-{half}": [r for r in corpus if _half(r["id"]) == half] for half in "ab"}
    return sources, questions


def distractors() -> dict[str, list[dict]]:
    return {"cranfield": _rows(DATA / "classic_cranfield" / "corpus.jsonl"),
            "arguana": _rows(DATA / "beir_arguana" / "corpus.jsonl")[:2000]}


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\"'])")


def pdf_copy(rows: list[dict]) -> list[dict]:
    """Each document cut into windows of two sentences (a table into windows of four lines), lines wrapped at 72
    characters: the same text as a PDF export holds it, no passage equal to the original."""
    copies = []
    for row in rows:
        lines = row["text"].splitlines() if "\n" in row["text"] else None
        pieces = lines if lines else _SENTENCE_END.split(row["text"])
        width = 4 if lines else 2
        for number, start in enumerate(range(0, len(pieces), width)):
            text = ("\n" if lines else " ").join(pieces[start:start + width]).strip()
            if text:
                copies.append({"id": f"{row['id']}#part{number}", "title": row.get("title", ""),
                               "text": text if lines else textwrap.fill(text, 72)})
    return copies


_NUMBER = re.compile(r"\d")


def edited_copy(rows: list[dict], seed: int) -> list[dict]:
    """The same documents, EDITED_SHARE of them edited as a second edition edits: the first digit changed, and a
    sentence added."""
    rng = random.Random(seed)
    copies = []
    for row in rows:
        text = row["text"]
        if rng.random() < EDITED_SHARE:
            text = _NUMBER.sub(lambda m: str((int(m.group()) + 1) % 10), text, count=1)
            text += " This passage was revised in the second edition."
        copies.append({**row, "text": text})
    return copies


def digest(sources: dict[str, list[dict]], seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [row for rows in sources.values() for row in rows if rng.random() < DIGEST_SHARE]


def origin(candidate: Candidate) -> str:
    return (candidate.parent_id or candidate.doc_id).split("#part")[0]


_SPACE = re.compile(r"\s+")


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def covers(candidate: Candidate, unit: tuple[str, str | None]) -> bool:
    document, sentence = unit
    return origin(candidate) == document and (sentence is None or _normal(sentence) in _normal(candidate.text))


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + 3]) for i in range(max(1, len(words) - 2))}


def repeats(candidates: list[Candidate]) -> int:
    """Passages that repeat a better-ranked one: most of the shorter one's runs of three words are in the other
    (a part of a document, an edited copy; two tables that share their column names do not)."""
    count, seen = 0, []
    for candidate in candidates:
        runs = _shingles(candidate.text)
        if any(len(runs & other) >= REPEAT_CONTAINMENT * max(1, min(len(runs), len(other))) for other in seen):
            count += 1
        seen.append(runs)
    return count


def ndcg_by_origin(candidates: list[Candidate], relevant: set[str], k: int = 10) -> float:
    seen, gains = set(), []
    for candidate in candidates[:k]:
        document = origin(candidate)
        gains.append(1.0 if document in relevant and document not in seen else 0.0)
        seen.add(document)
    dcg = sum(g / np.log2(i + 2) for i, g in enumerate(gains))
    ideal = sum(1 / np.log2(i + 2) for i in range(min(k, len(relevant))))
    return float(dcg / ideal) if ideal else 0.0


def measure(question: Question, ranked: list[Candidate]) -> dict[str, float]:
    def complete(k: int) -> float:
        return float(all(any(covers(c, unit) for c in ranked[:k]) for unit in question.units))

    found = sum(any(covers(c, unit) for c in ranked[:10]) for unit in question.units)
    return {"complete@5": complete(5), "complete@10": complete(10), "distinct gold@10": found / len(question.units),
            "repeats@10": float(repeats(ranked[:10])),
            "ndcg@10": ndcg_by_origin(ranked, {document for document, _ in question.units})}


def mmr(candidates: list[Candidate], vectors: np.ndarray, query: np.ndarray, weight: float, k: int) -> list[int]:
    """Maximal marginal relevance over passages (Carbonell & Goldstein 1998): each next passage maximises
    weight * cos(q, d) - (1 - weight) * max cos(d, chosen)."""
    relevance = vectors @ query
    chosen: list[int] = []
    closest = np.full(len(candidates), -np.inf)
    while len(chosen) < min(k, len(candidates)):
        gains = weight * relevance - (1 - weight) * np.where(np.isfinite(closest), closest, 0.0)
        gains[chosen] = -np.inf
        best = int(np.argmax(gains))
        chosen.append(best)
        closest = np.maximum(closest, vectors @ vectors[best])
    return chosen


def without_near_duplicates(order: list[int], vectors: np.ndarray) -> list[int]:
    kept: list[int] = []
    for index in order:
        if not kept or float(np.max(vectors[kept] @ vectors[index])) < DUPLICATE_COSINE:
            kept.append(index)
    return kept


class Bench:
    """One workspace holding every source; each question asked once per overlap kind, every method ranking the
    same candidates."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.collections = {"hotpotqa": hotpotqa(), "tatqa": tatqa(), "scifact": scifact()}
        self.distractors = distractors()
        self.ws = self._build()
        self.encoder = load_encoder()

    def _build(self) -> Workspace:
        folder, rows_of = self.folder, dict(self.distractors)
        for collection, (sources, _) in self.collections.items():
            rows_of.update(sources)
            first = sources[f"{collection}-a"]
            rows_of[f"{collection}-pdf"] = pdf_copy(first)
            rows_of[f"{collection}-v2"] = edited_copy(first, 1)
            rows_of[f"{collection}-digest"] = digest({**sources, **self.distractors}, 2)
        lines = ['workspace = "ws"']
        for collection, (sources, _) in self.collections.items():
            lines += [f"[sources.{collection}-mirror]", 'kind = "lancedb"', f'uri = "{folder / "lance"}"',
                      f'table = "{collection}"', 'title_field = "title"']
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gradfuse.toml").write_text("\n".join(lines) + "\n")
        ws = Workspace(load_config(folder / "gradfuse.toml"))
        for name, rows in rows_of.items():
            path = folder / "inputs" / f"{name}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps({"id": r["id"], "title": r.get("title", ""), "text": r["text"]}) + "\n"
                                    for r in rows))
            ws.index(SourceSpec(name, "jsonl", str(path)))
        cache = EmbeddingCache(folder / "ws" / "cache" / "embeddings.sqlite", load_encoder())
        for collection, (sources, _) in self.collections.items():
            self._mirror(collection, sources[f"{collection}-a"], cache)
        ws.catalog.summaries.make(ws.source_names())  # the mirrors' routing summaries, ahead of the questions
        return ws

    def _mirror(self, collection: str, rows: list[dict], cache: EmbeddingCache) -> None:
        import lancedb
        import pyarrow as pa

        vectors = cache.embed([embedding_text(r.get("title", ""), r["text"]) for r in rows])
        table = pa.table({"id": [r["id"] for r in rows], "title": [r.get("title", "") for r in rows],
                          "text": [r["text"] for r in rows],
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)),
                                                                      vectors.shape[1])})
        lancedb.connect(str(self.folder / "lance")).create_table(collection, table, mode="overwrite")

    def sources(self, collection: str, kind: str) -> list[str]:
        base = [f"{collection}-a", f"{collection}-b", *self.distractors]
        copies = COPIES.values() if kind == "all" else [COPIES[kind]] if kind in COPIES else []
        return base + [f"{collection}-{copy}" for copy in copies]

    def questions(self, split: str) -> list[Question]:
        return [q for _, questions in self.collections.values() for q in questions if q.split == split]

    def rankings(self, question: Question, names: list[str], settings: dict) -> dict[str, tuple[list, float, int]]:
        """Every method's top 10 over one retrieval of `names`, with its seconds (the retrieval's and its own
        ranking's) and the sources asked."""
        query = self.ws.query
        federated = query.retrieve(question.text, sources=names, depth=DEPTH)
        retrieval, ranked = federated.wall_seconds, {}
        for measure, lam in [("similarity", 0.0), *settings["selects"]]:
            started = time.perf_counter()
            result = query.rank(question.text, federated, method="select", k=10,
                                selection=SelectionSettings(redundancy_weight=lam, redundancy=measure))
            ranked[select_row(measure, lam)] = (result.candidates, retrieval + time.perf_counter() - started,
                                                len(names))
        for method in ("dense", "rrf", "concat"):
            started = time.perf_counter()
            result = query.rank(question.text, federated, method=method, k=DEPTH * len(names))
            ranked[method] = (result.candidates[:10], retrieval + time.perf_counter() - started, len(names))
            if method == "dense":
                pool, pool_seconds = result.candidates, retrieval + time.perf_counter() - started
        started = time.perf_counter()
        vectors = query.embed(pool)
        vector = self.encoder.encode_query(question.text)
        embedded = time.perf_counter() - started
        for weight in sorted({settings["mmr"], *settings.get("mmrs", ())}):
            started = time.perf_counter()
            chosen = mmr(pool, vectors, vector, weight, 10)
            ranked[f"dense + MMR {weight:g}"] = ([pool[i] for i in chosen],
                                                 pool_seconds + embedded + time.perf_counter() - started, len(names))
        started = time.perf_counter()
        kept = without_near_duplicates(list(range(len(pool))), vectors)[:10]
        ranked["dense, near duplicates dropped"] = ([pool[i] for i in kept],
                                                    pool_seconds + embedded + time.perf_counter() - started,
                                                    len(names))
        return ranked

    def routed(self, question: Question, names: list[str], weight: float) -> tuple[list, float, int]:
        self.ws.config.routing = RoutingSettings(above=0, budget=3, redundancy_weight=weight, widen_margin=0.0)
        started = time.perf_counter()
        result = self.ws.search(question.text, sources=names, method="select", k=10, depth=DEPTH)
        return result.candidates, time.perf_counter() - started, len(result.routing.asked)

    def answer_recall(self, question: Question, passages: list[Candidate]) -> float | None:
        if not question.answers:
            return None
        evidence = self.ws.evidence(question.text, passages[:5])
        return answer_in_context(question.answers, [extractive_answer(evidence, question=question.text)])


def select_row(measure: str, lam: float) -> str:
    return RELEVANCE_ONLY if lam == 0 else f"select, {measure} redundancy λ={lam:g}"


def tune(bench: Bench) -> dict:
    """Select's redundancy weight, MMR's weight and routing's redundancy weight: each the best mean complete
    evidence@5 over the dev questions of every overlap kind (relevance-only kept on a tie)."""
    dev = bench.questions("dev")
    scores: dict[str, list[float]] = {}
    for kind in KINDS:
        for question in dev:
            names = bench.sources(question.collection, kind)
            ranked = bench.rankings(question, names, {"selects": [(m, lam) for m in MEASURES for lam in LAMBDAS],
                                                      "mmr": MMR_WEIGHTS[0], "mmrs": MMR_WEIGHTS})
            for row, (candidates, _, _) in ranked.items():
                scores.setdefault(row, []).append(measure(question, candidates)["complete@5"])
            for weight in (0.0, *ROUTING_LAMBDAS):
                candidates, _, _ = bench.routed(question, names, weight)
                scores.setdefault(f"routing to 3, λ={weight:g}, then select", []).append(
                    measure(question, candidates)["complete@5"])
        print(f"dev {kind}: " + ", ".join(f"{r} {np.mean(v):.3f}" for r, v in scores.items()), flush=True)
    mean = {row: float(np.mean(values)) for row, values in scores.items()}
    best = {m: max((0.0, *LAMBDAS), key=lambda lam: (mean[select_row(m, lam)], -lam)) for m in MEASURES}
    best_mmr = max(MMR_WEIGHTS, key=lambda w: (mean[f"dense + MMR {w:g}"], w))
    best_routing = max((0.0, *ROUTING_LAMBDAS), key=lambda w: (mean[f"routing to 3, λ={w:g}, then select"], -w))
    return {"lambda": best, "mmr": best_mmr, "routing lambda": best_routing, "dev complete@5": mean,
            "dev questions": len(dev)}


def run(bench: Bench, tuned: dict, results: ResultsFile) -> None:
    test = bench.questions("test")
    for kind in KINDS:
        per_row: dict[str, dict[str, list]] = {}
        for question in test:
            names = bench.sources(question.collection, kind)
            ranked = bench.rankings(question, names, {"selects": [(m, lam) for m, lam in tuned["lambda"].items()
                                                                  if lam], "mmr": tuned["mmr"]})
            for weight in sorted({0.0, tuned["routing lambda"]}):
                ranked[f"routing to 3, λ={weight:g}, then select"] = bench.routed(question, names, weight)
            for row, (candidates, seconds, asked) in ranked.items():
                values = per_row.setdefault(row, {"questions": [], "seconds": [], "asked": [], "answer": []})
                values["questions"].append((question, measure(question, candidates)))
                values["seconds"].append(seconds)
                values["asked"].append(asked)
                answered = (RELEVANCE_ONLY, *(select_row(m, lam) for m, lam in tuned["lambda"].items()), "dense",
                            f"dense + MMR {tuned['mmr']:g}", "dense, near duplicates dropped")
                if row in answered and question.answers:
                    values["answer"].append(bench.answer_recall(question, candidates))
        baseline = np.array([m["complete@5"] for _, m in per_row[RELEVANCE_ONLY]["questions"]])
        for row, values in per_row.items():
            results.add(f"{kind} · {row}", {"kind": kind, "method": row, **summarise(values, baseline)})
        print(f"test {kind}: " + ", ".join(f"{r} {results.rows[f'{kind} · {r}']['complete@5']['mean']:.3f}"
                                          for r in per_row), flush=True)


def summarise(values: dict, baseline: np.ndarray) -> dict:
    measured = values["questions"]
    out: dict = {"questions": len(measured)}
    for metric in ("complete@5", "complete@10", "distinct gold@10", "repeats@10", "ndcg@10"):
        if metric.startswith("complete"):
            pairs = [(q, m[metric]) for q, m in measured if q.two_passage]
            out[f"{metric} (two-passage)"] = _estimate([v for _, v in pairs])
        out[metric] = _estimate([m[metric] for _, m in measured])
    mine = np.array([m["complete@5"] for _, m in measured])
    out["vs relevance-only"] = paired_difference(mine, baseline)
    answered = [a for a in values["answer"] if a is not None]
    out["answer recall"] = _estimate(answered) if answered else None
    out["sources asked"] = round(float(np.mean(values["asked"])), 2)
    out["ms p50"] = round(1000 * float(np.median(values["seconds"])), 1)
    return out


def _estimate(values: list[float]) -> dict:
    return {**mean_interval(values), "n": len(values)}


def markdown(results: ResultsFile, tuned: dict) -> str:
    lines = ["# Stage 1 where sources overlap", "", f"{results.provenance} bench/overlap.py's docstring says how.",
             f"Tuned on {tuned['dev questions']} dev questions (complete evidence@5, every overlap kind): select's "
             "redundancy weight λ = " + ", ".join(f"{lam:g} by {m}" for m, lam in tuned["lambda"].items())
             + f" (0: relevance only was best), MMR's weight {tuned['mmr']:g}, routing's redundancy weight "
             f"{tuned['routing lambda']:g}. Means with 95% bootstrap intervals; Δ and p: complete evidence@5 against "
             "relevance-only `select` (λ = 0, the default) on the same questions, paired randomisation test.", ""]
    columns = ("complete@5", "complete@5 (two-passage)", "complete@10 (two-passage)", "distinct gold@10",
               "repeats@10", "ndcg@10")
    for kind in KINDS:
        rows = [r for r in results.rows.values() if r["kind"] == kind]
        lines += [f"## {kind} ({rows[0]['questions']} test questions)", "",
                  "| method | " + " | ".join(columns) + " | answer recall | Δ complete@5 (p) | sources asked | ms p50 |",
                  "|---|" + "---:|" * (len(columns) + 4)]
        for r in rows:
            cells = [f"{r[c]['mean']:.3f}" for c in columns]
            answer = "–" if r["answer recall"] is None else f"{r['answer recall']['mean']:.3f}"
            lines.append(f"| {r['method']} | " + " | ".join(cells) + f" | {answer} | "
                         f"{r['vs relevance-only']['delta']:+.3f} ({r['vs relevance-only']['p']:.3g}) | "
                         f"{r['sources asked']} | {r['ms p50']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, help="at most this many dev and test questions a collection")
    args = parser.parse_args()
    if args.questions:
        for collection, (dev, test) in QUESTIONS.items():
            QUESTIONS[collection] = (min(dev, args.questions), min(test, args.questions))
    bench = Bench(WORK / "build")
    tuned = tune(bench)
    print(json.dumps(tuned), flush=True)
    out = WORK / "look" if args.questions else OUT
    results = ResultsFile.start(out, "make bench-overlap", tuned=tuned, depth=DEPTH,
                                questions={c: {"dev": d, "test": t} for c, (d, t) in QUESTIONS.items()})
    run(bench, tuned, results)
    results.finish(markdown(results, tuned))
    bench.ws.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
