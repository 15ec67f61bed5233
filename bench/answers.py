"""The answer benchmark: what a user asks of documents nobody here wrote, over many sources at once, a third of it with
no answer anywhere (issue 28; `make bench-answers`, after `bench/fit_support.py`).

Sources (each its own; none of their files is copied into the repository, they are made or copied at each run):
- manuals (two PDF manuals Debian packages ship), debian (Debian's release table, CSV), ubuntu (Ubuntu's, as a
  workbook), python-statements (five statements of Python's reference, Word), stdlib-slides (ten modules, slides):
  the files of `bench/documents.py`;
- man-pages: 25 manual pages as `man` renders them for a terminal (gzip and bzip2 and xz and zstd, ssh and scp, grep
  and sed, ...: look-alikes the right one of which must be found); valgrind: Valgrind's HTML manual;
- hotpotqa: HotpotQA's paragraphs, less the gold paragraphs of the HotpotQA questions held out as unanswerable;
  tatqa: TAT-QA's report paragraphs.

Questions (answers checked in the indexed files before anything is measured; a question whose check fails is
dropped and counted): the 30 of `bench/documents.py`; 43 over the man pages and the manual, written by reading them
(`bench/answer_questions.json`, each with the file whose text holds the answer); HotpotQA and TAT-QA test questions;
and with no answer anywhere: 25 written over the same man pages and manual (near misses: rsync beside gzip's
--rsyncable, lz4 beside zstd), HotpotQA questions whose paragraphs were held out (their answer string is in no
source; their distractor paragraphs stay), and PubMedQA questions (no source holds biomedical abstracts). A seeded third of each kind is dev
(`bench/fit_support.py` fits the evidence weights and the "not found" threshold on it); everything below is test.

Per method, over the test questions: hit@1 and hit@5 (a passage from the answer's place: its page, row, slide or
section, or for a man page or an HTML page the passage of that file holding the answer string, or a HotpotQA or
TAT-QA question's judged paragraph), quoted answer correct (the gold answer inside the sentences the extractive
answer quotes, and not declined), declined (no-answer questions), declined wrongly (answerable ones), and seconds
per answer (`Workspace.ask`, warm). Then the evidence scorers on the default method's passages, the "not found"
curve, and the extractive answers of the QA benchmark's test questions (HotpotQA, TAT-QA) by each sentence scorer.
Writes results/answers/results.{md,json}.

    python bench/answers.py
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gradfuse import SourceSpec, Workspace
from gradfuse.candidate import Candidate
from gradfuse.config import Config
from gradfuse.eval.qa import answer_in_context, checkable
from gradfuse.reading.evidence import extractive_answer
from gradfuse.reading import support
PASSAGE_CHARS = 600  # what the prompt showed of each passage before issue 70 (these rows measure that)
from gradfuse.indexing.build import FILE_CHUNK_OVERLAP, FILE_CHUNK_WORDS
from gradfuse.ingest.documents import IngestReport
from gradfuse.ingest.files import read_files
from gradfuse.eval.record import ResultsFile

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import documents  # noqa: E402  (bench/documents.py: the five formats' files and questions)

DATA = Path(os.environ.get("GRADFUSE_DATA", ROOT.parent / "shared" / "data"))
OUT = ROOT / "results" / "answers"
WORK = ROOT / ".gradfuse" / "bench" / "answers"  # inputs and indexes, kept between runs (nothing rebuilds twice)
QUESTIONS_FILE = BENCH / "answer_questions.json"
MAN_PAGES = ("gzip", "bzip2", "xz", "zstd", "zip", "unzip", "tar", "ssh", "scp", "ssh-keygen", "curl", "wget", "grep",
             "sed", "find", "xargs", "make", "psql", "python3.11", "less", "diff", "patch", "sort", "du", "valgrind")
VALGRIND = Path("/usr/share/doc/valgrind/html")
METHODS = ("rrf", "combsum-z", "concat", "dense", "select", "gro")
SCORERS = ("support", "gate", "cosine")  # evidence scorers compared on the default method's passages
K = 5  # passages an answer reads (the runs asked with k = 5)
SEED = 0
# (answerable, held out) per QA set. TAT-QA questions are not held out: they ask about "the company" of their own
# report, and another report's paragraph answers the same question.
QA_COUNTS = {"hotpotqa": (25, 25), "tatqa": (25, 0)}
PUBMED_COUNT = 25


@dataclass
class Question:
    id: str
    kind: str  # document, man, valgrind, hotpotqa, tatqa, pubmedqa
    text: str
    answers: tuple[str, ...] = ()  # empty: no source holds an answer
    file: str | None = None  # the file holding the answer (document, man, valgrind)
    place: dict = field(default_factory=dict)  # page, row, slide or heading (document questions)
    judged: frozenset = frozenset()  # source/doc id keys of the judged paragraphs (hotpotqa, tatqa)
    held: tuple[str, ...] = ()  # a held-out QA question's own answers: they must stand in no source
    near_miss: bool = False  # a written no-answer question the sources come close to (answer_questions.json)
    split: str = "test"

    @property
    def answerable(self) -> bool:
        return bool(self.answers)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def read_qrels(path: Path) -> dict[str, set[str]]:
    judged: dict[str, set[str]] = {}
    for line in open(path, encoding="utf-8"):
        query, doc, relevance = line.rstrip("\n").split("\t")
        if int(relevance) > 0:
            judged.setdefault(query, set()).add(doc)
    return judged


def render_man_pages(folder: Path) -> list[str]:
    """Each page as `man` prints it for a terminal of 80 columns (no hyphenation or justification)."""
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for page in MAN_PAGES:
        shown = subprocess.run(["man", "--nh", "--nj", "-P", "cat", page], capture_output=True, text=True,
                               env={**os.environ, "MANWIDTH": "80"})
        if shown.returncode == 0 and shown.stdout.strip():
            text = subprocess.run(["col", "-bx"], input=shown.stdout, capture_output=True, text=True).stdout
            (folder / f"{page}.txt").write_text(text, encoding="utf-8")
            made.append(f"{page}.txt")
    return made


def qa_sets(rng: random.Random) -> tuple[list[Question], dict[str, set[str]]]:
    """HotpotQA and TAT-QA test questions with checkable answers: some answerable, some held out (their judged
    paragraphs removed from the sources: `removed`, per set)."""
    questions, removed = [], {}
    sets = {
        "hotpotqa": ("hotpotqa_train100_hipporag", read_jsonl(DATA / "hotpotqa_train100_hipporag" / "queries.jsonl")[20:]),
        "tatqa": ("tatqa_hybrid", [q for q in read_jsonl(DATA / "tatqa_hybrid" / "queries.jsonl")
                                   if q["split"] == "test" and q["answer_type"] == "span" and q["answer_from"] == "text"]),
    }
    for name, (folder, pool) in sets.items():
        qrels = read_qrels(DATA / folder / "qrels.tsv")
        usable = [q for q in pool if checkable(tuple(q["answers"])) and qrels.get(q["id"])]
        rng.shuffle(usable)
        answerable, held = QA_COUNTS[name]
        removed[name] = set()
        for number, q in enumerate(usable[: answerable + held]):
            judged = {d for d in qrels[q["id"]] if name != "tatqa" or d.startswith("text/")}
            out = number >= answerable
            if out:
                removed[name] |= judged
            answers = tuple(q["answers"])
            questions.append(Question(f"{name}:{q['id']}", name, q["text"], () if out else answers,
                                      judged=frozenset(f"{name}/{d}" for d in judged), held=answers if out else ()))
    return questions, removed


def pubmed_questions(rng: random.Random) -> list[Question]:
    pool = read_jsonl(DATA / "pubmedqa_pqal" / "queries.jsonl")
    return [Question(f"pubmedqa:{q['id']}", "pubmedqa", q["text"]) for q in rng.sample(pool, PUBMED_COUNT)]


def drawn_questions() -> tuple[list[Question], dict[str, set[str]], list[Question]]:
    """The seeded draws of data-set questions: the QA sets' (and the paragraphs held out), then PubMedQA's."""
    rng = random.Random(SEED)
    qa, removed = qa_sets(rng)
    return qa, removed, pubmed_questions(rng)


def written_questions() -> list[Question]:
    questions = []
    for number, q in enumerate(json.loads(QUESTIONS_FILE.read_text())):
        kind = "valgrind" if q.get("file", "").endswith(".html") else "man"
        answers = (q["answer"],) if q["kind"] == "answerable" else ()
        questions.append(Question(f"written:{number}", kind if answers else "written-none", q["question"], answers,
                                  file=q.get("file"), near_miss=q.get("near_miss", False)))
    return questions


def document_questions() -> list[Question]:
    return [Question(f"document:{number}", "document", text, (answer,), file=file, place=where)
            for number, (_, file, where, text, answer) in enumerate(documents.QUESTIONS)]


def build() -> tuple[Workspace, list[Question], dict]:
    """Every source built (or found unchanged) in WORK, and every question checked against the indexed text."""
    inputs = WORK / "inputs"
    if inputs.exists():
        shutil.rmtree(inputs)
    made = documents.write_files(inputs / "documents")
    man = render_man_pages(inputs / "man-pages")
    (inputs / "valgrind").mkdir(parents=True)
    for page in sorted(VALGRIND.glob("*.html")):
        shutil.copy(page, inputs / "valgrind" / page.name)
    qa, removed, pubmed = drawn_questions()
    corpora = {"hotpotqa": [d for d in read_jsonl(DATA / "hotpotqa_train100_hipporag" / "corpus.jsonl")
                            if d["id"] not in removed["hotpotqa"]],
               "tatqa": [d for d in read_jsonl(DATA / "tatqa_hybrid" / "corpus.jsonl")
                         if d["id"].startswith("text/") and d["id"] not in removed["tatqa"]]}
    for name, records in corpora.items():
        with open(inputs / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps({"id": record["id"], "title": record.get("title", ""),
                                         "text": record["text"]}) + "\n")
    names = {"pdf": "manuals", "csv": "debian", "xlsx": "ubuntu", "docx": "python-statements", "pptx": "stdlib-slides"}
    specs = [SourceSpec(names[kind], "files", str(inputs / "documents" / kind)) for kind in made]
    specs += [SourceSpec("man-pages", "files", str(inputs / "man-pages")),
              SourceSpec("valgrind", "files", str(inputs / "valgrind")),
              SourceSpec("hotpotqa", "jsonl", str(inputs / "hotpotqa.jsonl")),
              SourceSpec("tatqa", "jsonl", str(inputs / "tatqa.jsonl"))]
    ws = Workspace(Config(workspace=WORK / "workspace"))
    builds = {}
    for spec in specs:
        report = ws.index(spec)
        builds[spec.name] = {"documents": report.documents, "seconds": round(report.seconds, 1),
                             "skipped": len(report.skipped)}
    questions = document_questions() + written_questions() + qa + pubmed
    passages = _passages(specs)
    kept, dropped = [], []
    for q in questions:
        (kept if _checked(q, passages) else dropped).append(q)
    _split(kept)
    return ws, kept, {"builds": builds, "dropped": [q.text for q in dropped], "man_pages": len(man)}


def _passages(specs: list[SourceSpec]) -> list[Candidate]:
    """Every passage the builds indexed, as the same readers and chunking made them (files), or every record."""
    passages = []
    for spec in specs:
        if spec.kind == "files":
            passages += [Candidate(spec.name, d.doc_id, d.text, 0.0, 1, location=d.location) for d in
                         read_files(Path(spec.path), IngestReport(), words=FILE_CHUNK_WORDS, overlap=FILE_CHUNK_OVERLAP)]
        else:
            passages += [Candidate(spec.name, r["id"], r["text"], 0.0, 1) for r in read_jsonl(Path(spec.path))]
    return passages


def _checked(q: Question, passages: list[Candidate]) -> bool:
    """An answerable question's answer stands at its place in the indexed text; a held-out QA question's answer
    stands in no source."""
    if q.held:
        return all(answer_in_context(q.held, [c.text]) != 1.0 for c in passages)
    return not q.answerable or any(holds_answer(q, c) for c in passages)


def holds_answer(q: Question, candidate) -> bool:
    """Whether `candidate` is a passage that answers q: at its place and holding its answer (files), or one of
    its judged paragraphs (QA sets)."""
    if q.judged:
        return f"{candidate.source}/{candidate.doc_id}" in q.judged
    location = candidate.location
    if location is None or Path(location.file).name != q.file:
        return False
    if q.place and not documents.at_place(candidate, location.file, q.place):
        return False
    return q.kind == "document" or answer_in_context(q.answers, [candidate.text]) == 1.0


def _split(questions: list[Question]) -> None:
    """A seeded third of each kind (answerable and not apart) is dev, each drawn with its own seed: questions added
    to one kind leave the others' splits as they were."""
    groups: dict[tuple[str, bool], list[Question]] = {}
    for q in questions:
        groups.setdefault((q.kind, q.answerable), []).append(q)
    for (kind, answerable), group in groups.items():
        for q in random.Random(f"{SEED}:{kind}:{answerable}").sample(group, len(group) // 3):
            q.split = "dev"


def quoted_correct(q: Question, text: str) -> float:
    return float(answer_in_context(q.answers, [text]) == 1.0)


def ask(ws: Workspace, q: Question, method: str, before: bool = False) -> dict:
    started = time.perf_counter()
    answer = ws.ask(q.text, method=method, context_k=K)
    seconds = time.perf_counter() - started
    if before:  # the same passages, as "not found" read them before
        row_before = {"support before": support_before(ws, q.text, answer.passages)}
    hits = [holds_answer(q, c) for c in answer.passages]
    row = {"id": q.id, "kind": q.kind, "answerable": q.answerable, "near_miss": q.near_miss, "seconds": seconds,
           "support": answer.support, "declined": answer.abstained, "answer": answer.text}
    if q.answerable:
        row.update({"hit@1": float(any(hits[:1])), "hit@5": float(any(hits[:5])),
                    "quoted": 0.0 if answer.abstained else quoted_correct(q, answer.text)})
    return {**row, **row_before} if before else row


BEFORE = "gate, first 600 characters (before)"  # how a quoted answer was chosen before: the gate over the prompt's view
# "Not found" as shipped on 2026-12-02 (fitted on that day's dev third, some of whose questions are test now): the
# chance σ(bias + overlap · best overlap + cosine · best cosine of every sentence), declined below 0.21.
NOT_FOUND_BEFORE = {"overlap": 5.6734, "cosine": 5.8898, "bias": -5.5507, "abstain_below": 0.21}


def chance_before(found: dict[str, np.ndarray]) -> float:
    """The chance "not found" read before, from an answer's signals (every sentence's cosine)."""
    if not len(found["overlap"]):
        return 0.0
    b = NOT_FOUND_BEFORE
    logit = b["bias"] + b["overlap"] * float(found["overlap"].max()) + b["cosine"] * float(found["cosine"].max())
    return 1.0 / (1.0 + np.exp(-logit))


def support_before(ws: Workspace, question: str, passages: list[Candidate]) -> float:
    evidence = sorted(ws.evidence(question, passages), key=lambda e: (e.passage, e.span))
    texts = [e.quoted() for e in evidence]
    encoder = ws.query.encoder()
    cosines = encoder.encode_short(texts) @ encoder.encode_query(question) if texts else np.zeros(0)
    return chance_before(support.signals(question, texts, cosines, [e.passage for e in evidence],
                                         only=("overlap", "cosine")))


def scorer_rows(ws: Workspace, q: Question, method: str) -> dict:
    """The quoted answer each evidence scorer would give from the same passages (the default method's), whole, and
    the gate over the first PASSAGE_CHARS characters of each, as answers were quoted before."""
    passages = ws.search(q.text, method=method, k=K).candidates
    row = {"id": q.id, "kind": q.kind}
    encoder = ws.query.encoder()
    encoder._short.clear()  # the answers asked before encoded these sentences; a new question's are not yet
    encoder.encode_query(q.text)  # but its search has encoded the question itself
    cpu = time.process_time()  # the evidence step of an answer: its sentences scored, and "not found" or not
    ws.support(q.text, ws.evidence(q.text, passages))
    row["evidence CPU seconds"] = time.process_time() - cpu
    for scorer, chars in [(s, None) for s in SCORERS] + [(BEFORE, PASSAGE_CHARS)]:
        started = time.perf_counter()
        settings = replace(ws.config.evidence, scorer=scorer.split(",")[0])
        evidence = ws.evidence(q.text, passages, settings=settings, chars=chars)
        row[f"{scorer} seconds"] = time.perf_counter() - started
        within = support.model().second_within if settings.scorer == "support" else None
        row[scorer] = quoted_correct(q, extractive_answer(evidence, within=within, question=q.text)) if evidence else 0.0
    return row


def main() -> None:
    started = time.perf_counter()
    ws, questions, built = build()
    test = [q for q in questions if q.split == "test"]
    default = ws.config.method
    results = ResultsFile.start(OUT, "make bench-answers", default=default,
                                abstain_below=ws.config.evidence.abstain_below,
                                questions={"test": len(test), "dev": len(questions) - len(test),
                                           "no answer": sum(not q.answerable for q in questions),
                                           "by kind (test)": count_kinds(test)}, **built)
    for q in test[:3]:  # warm: the encoder, the scoring LM and ranx's compiled code are loaded before timing
        for method in METHODS:
            ws.ask(q.text, method=method, context_k=K)
    for method in METHODS:
        asked = [ask(ws, q, method, before=method == default) for q in test]
        results.add(method, method_row(asked, default=method == default))
        print(f"{method}: {len(test)} questions", file=sys.stderr, flush=True)
    results.header.update(scorer_summary([scorer_rows(ws, q, default) for q in test if q.answerable]),
                          minutes=(time.perf_counter() - started) / 60)
    results.header["qa_extractive"] = qa_extractive(ws)
    results.finish(report(results))
    print(report(results))


def method_row(asked: list[dict], default: bool) -> dict:
    """A method's summary over the test questions, by kind, and its answers; the default method's also with the
    "not found" curves (overall, by kind, and as "not found" read before)."""
    kinds = sorted({r["kind"] for r in asked})
    row = {**summarise(asked), "kinds": {kind: summarise([r for r in asked if r["kind"] == kind]) for kind in kinds}}
    if default:
        row |= {"curve": curve(asked), "curve before": curve(asked, "support before"), "before": before_summary(asked),
                "kind curves": {kind: curve([r for r in asked if r["kind"] == kind]) for kind in kinds}}
    return {**row, "per question": asked}


def scorer_summary(scorers: list[dict]) -> dict:
    cpu = [r["evidence CPU seconds"] for r in scorers]
    return {"scorers": {s: {"quoted": mean([r[s] for r in scorers]),
                            "seconds": mean([r[f"{s} seconds"] for r in scorers])} for s in (*SCORERS, BEFORE)},
            "evidence CPU seconds": {"p50": float(np.median(cpu)), "p90": float(np.percentile(cpu, 90))}}


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def wilson(values: list[float]) -> tuple[float, float] | None:
    """The 95% Wilson interval of a share of successes."""
    if not values:
        return None
    n, share, z = len(values), float(np.mean(values)), 1.96
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(float(centre - half), 3), round(float(centre + half), 3)


def summarise(rows: list[dict]) -> dict:
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    shares = {"hit@1": [r["hit@1"] for r in answerable], "hit@5": [r["hit@5"] for r in answerable],
              "quoted": [r["quoted"] for r in answerable],
              "declined": [float(r["declined"]) for r in unanswerable],
              "declined wrongly": [float(r["declined"]) for r in answerable],
              "declined though a passage held it": [float(r["declined"]) for r in answerable if r["hit@5"]],
              "near misses declined": [float(r["declined"]) for r in unanswerable if r.get("near_miss")]}
    return {**{name: mean(values) for name, values in shares.items()},
            "ci": {name: wilson(values) for name, values in shares.items()},
            "seconds p50": float(np.median([r["seconds"] for r in rows])) if rows else float("nan"),
            "questions": len(rows), "answerable": len(answerable), "no answer": len(unanswerable),
            "near misses": len(shares["near misses declined"]), "held": len(shares["declined though a passage held it"])}


def curve(rows: list[dict], chance: str = "support") -> list[dict]:
    """At each threshold: the share of unanswerable questions declined and of answerable ones declined wrongly."""
    points = []
    for threshold in np.round(np.arange(0.0, 1.0001, 0.05), 2):
        declined = [r[chance] is not None and r[chance] < threshold for r in rows]
        points.append({"threshold": float(threshold),
                       "declined": mean([float(d) for d, r in zip(declined, rows) if not r["answerable"]]),
                       "declined wrongly": mean([float(d) for d, r in zip(declined, rows) if r["answerable"]])})
    return points


def before_summary(rows: list[dict]) -> dict:
    """"Not found" as it read before, at its threshold, on the same test questions and passages."""
    declined = [{**r, "declined": r["support before"] < NOT_FOUND_BEFORE["abstain_below"]} for r in rows]
    return summarise(declined)


def count_kinds(questions: list[Question]) -> dict:
    counts: dict[str, dict[str, int]] = {}
    for q in questions:
        entry = counts.setdefault(q.kind, {"answerable": 0, "no answer": 0})
        entry["answerable" if q.answerable else "no answer"] += 1
    return counts


def qa_extractive(ws: Workspace) -> dict:
    """The QA benchmark's test questions (HotpotQA's last 80, TAT-QA's first 60 test span answers from text) with
    the five passages the dense prior ranks first and their first PASSAGE_CHARS characters (`bench/evidence_budget.py`'s
    protocol, which measured today's gate): the extractive answer of each sentence scorer holds the gold answer how
    often, and at what cost."""
    from evidence_budget import FOLDERS, Pools, question_sets

    encoder = ws.query.encoder()
    pools = {name: Pools(name, encoder) for name in FOLDERS}
    out = {}
    for name, parts in question_sets().items():
        rows = []
        for q in parts["test"]:
            passages = pools[name].top(q["text"])
            row = {}
            for scorer in SCORERS:
                started = time.perf_counter()
                evidence = ws.evidence(q["text"], passages, settings=replace(ws.config.evidence, scorer=scorer),
                                       chars=PASSAGE_CHARS)
                row[f"{scorer} seconds"] = time.perf_counter() - started
                within = support.model().second_within if scorer == "support" else None
                row[scorer] = answer_in_context(tuple(q["answers"]), [extractive_answer(evidence, within=within,
                                                                                         question=q["text"])])
            rows.append(row)
        out[name] = {s: {"contains gold": mean([r[s] for r in rows]), "seconds": mean([r[f"{s} seconds"] for r in rows]),
                         "questions": sum(r[s] is not None for r in rows)} for s in SCORERS}
    return out



def report(results: ResultsFile) -> str:
    """The page, from what the results file holds so far: a run stopped half-way shows the methods it finished."""
    header = results.header
    methods = {m: results.rows[m] for m in METHODS if m in results.rows}
    default = methods.get(header["default"])
    lines = opening(results) + methods_table(header, methods)
    if default:
        lines += default_tables(header, default)
    if "scorers" in header:
        lines += scorer_tables(header)
    if default:
        lines += curve_tables(header, default)
    if header["dropped"]:
        lines += ["", f"Dropped before measuring (answer not found at its place): {len(header['dropped'])}: "
                  + "; ".join(header["dropped"])]
    return "\n".join(lines) + "\n"


def opening(results: ResultsFile) -> list[str]:
    qs, minutes = results.header["questions"], results.header.get("minutes")
    return ["# Answers from real documents, and saying \"not found\"", "",
            f"{results.provenance} It runs `bench/fit_support.py` on the dev questions, then `bench/answers.py` on "
            f"the test questions. {qs['test']} test questions ({qs['dev']} more are dev), {qs['no answer']} of all "
            "with no answer in any source; nine sources: two PDF manuals, Debian's and Ubuntu's release tables (CSV, "
            "workbook), Python statements (Word), stdlib modules (slides), 25 man pages, Valgrind's HTML manual, "
            "HotpotQA's paragraphs (less those of the questions held out) and TAT-QA's. Every answer reads "
            f"{K} passages; quoted: the gold answer in the sentences the extractive answer quotes, not declined. "
            "Seconds: `Workspace.ask`, warm, on that machine"
            + (f" ({minutes:.0f} min in all)." if minutes is not None else "."), ""]


def methods_table(header: dict, methods: dict) -> list[str]:
    lines = ["| method | hit@1 | hit@5 | quoted answer correct | no-answer questions declined | answerable declined "
             "wrongly | s / answer (p50) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for method, row in methods.items():
        name = f"`{method}`" + (" (the default)" if method == header["default"] else "")
        lines.append(f"| {name} | {row['hit@1']:.2f} | {row['hit@5']:.2f} | {row['quoted']:.2f} | {row['declined']:.2f} "
                     f"| {row['declined wrongly']:.2f} | {row['seconds p50']:.2f} |")
    return lines


def default_tables(header: dict, best: dict) -> list[str]:
    """The default method's measures with their intervals, and by kind of question."""
    lines = ["", f"`{header['default']}` with 95% intervals (Wilson):", "",
             "| measure | value | 95% interval | questions |", "|---|---:|---:|---:|"]
    for measure, count in (("quoted", "answerable"), ("declined", "no answer"), ("declined wrongly", "answerable"),
                           ("declined though a passage held it", "held"), ("near misses declined", "near misses")):
        low, high = best["ci"][measure] or (float("nan"), float("nan"))
        label = {"quoted": "quoted answer correct", "declined": "no-answer questions declined",
                 "declined wrongly": "answerable declined wrongly",
                 "declined though a passage held it": "answerable declined though one of its passages answers it",
                 "near misses declined": "near misses declined (written, the sources come close)"}[measure]
        lines.append(f"| {label} | {best[measure]:.2f} | {low:.2f}–{high:.2f} | {best[count]} |")
    lines += ["", f"By kind of test question (`{header['default']}`; hit@1 · quoted · declined; hotpotqa's no-answer "
              "questions are those whose paragraphs were held out):", "",
              "| kind | answerable | no answer | hit@1 | quoted | declined (no answer) | declined wrongly |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for kind, row in best["kinds"].items():
        counts = header["questions"]["by kind (test)"][kind]
        cells = [row[k] for k in ("hit@1", "quoted", "declined", "declined wrongly")]
        lines.append(f"| {kind} | {counts['answerable']} | {counts['no answer']} | "
                     + " | ".join("–" if np.isnan(c) else f"{c:.2f}" for c in cells) + " |")
    return lines


def scorer_tables(header: dict) -> list[str]:
    """The evidence scorers on the default method's passages, and on the QA benchmark's test questions."""
    lines = ["", f"Evidence scorers on `{header['default']}`'s passages, read whole as a quoted answer reads them, and "
             "the gate over their first 600 characters as answers were quoted before (answerable test questions; "
             "quoted: the two best sentences hold the gold answer):", "",
             "| scorer | quoted answer correct | s / answer |", "|---|---:|---:|"]
    for scorer, row in header["scorers"].items():
        lines.append(f"| {scorer} | {row['quoted']:.2f} | {row['seconds']:.3f} |")
    cpu = header["evidence CPU seconds"]
    lines += ["", f"The evidence step of an answer (its sentences scored by `support`, then \"not found\" or not), CPU "
              f"seconds of this process on {header['machine']}: p50 {cpu['p50']:.3f}, p90 {cpu['p90']:.3f}."]
    lines += ["", "Extractive answers on the QA benchmark's test questions (the dense prior's top 5 passages, as in "
              "results/evidence/budget.md, whose gate answers held the gold answer for 0.446 of HotpotQA's and 0.583 of "
              "TAT-QA's):", "", "| set | scorer | contains gold | questions | s / answer |", "|---|---|---:|---:|---:|"]
    for name, scorers in header["qa_extractive"].items():
        for scorer, row in scorers.items():
            lines.append(f"| {name} | {scorer} | {row['contains gold']:.3f} | {row['questions']} | {row['seconds']:.3f} |")
    return lines


def curve_tables(header: dict, best: dict) -> list[str]:
    """"Not found" on the default method's answers as the threshold moves: now and as it read before, and by kind."""
    old = best["before"]
    lines = ["", f"\"Not found\" on the test questions as the threshold moves (`{header['default']}`; the library's "
             f"`[evidence] abstain_below` is {header['abstain_below']:.2f}, chosen on the fitting sets), and as it "
             "read before on the same passages (its model of 2026-12-02, fitted on that day's dev third, some of "
             f"whose questions are test now; at its {NOT_FOUND_BEFORE['abstain_below']:.2f}: {old['declined']:.2f} "
             f"declined (95% {old['ci']['declined'][0]:.2f}–{old['ci']['declined'][1]:.2f}), "
             f"{old['declined wrongly']:.2f} "
             f"wrongly ({old['ci']['declined wrongly'][0]:.2f}–{old['ci']['declined wrongly'][1]:.2f}; "
             f"{old['declined though a passage held it']:.2f} where a passage held the answer), near misses "
             f"{old['near misses declined']:.2f}):", "",
             "| threshold | no-answer declined | answerable declined wrongly | before: no-answer declined | before: "
             "wrongly |", "|---:|---:|---:|---:|---:|"]
    for point, was in zip(best["curve"], best["curve before"]):
        lines.append(f"| {point['threshold']:.2f} | {point['declined']:.2f} | {point['declined wrongly']:.2f} | "
                     f"{was['declined']:.2f} | {was['declined wrongly']:.2f} |")
    columns = [(kind, measure) for kind, points in best["kind curves"].items()
               for measure in ("declined", "declined wrongly") if not np.isnan(points[-1][measure])]
    lines += ["", "The same curve by kind of test question: its no-answer questions declined, or its answerable ones "
              "declined wrongly:", "", "| threshold | " + " | ".join(f"{k} ({'wrongly' if m != 'declined' else 'no answer'})"
                                                               for k, m in columns) + " |",
              "|---:|" + "---:|" * len(columns)]
    for i, point in enumerate(best["curve"]):
        lines.append(f"| {point['threshold']:.2f} | "
                     + " | ".join(f"{best['kind curves'][k][i][m]:.2f}" for k, m in columns) + " |")
    return lines


if __name__ == "__main__":
    main()
