"""The reading benchmark (issue 70): does what the five passages hold reach the user? 174 questions written by hand
over six Debian document families that no fit, test or training set here uses (benchmarks/reading/SOURCE.md: SQLite's
and Lua's HTML manuals, gnuplot's PDF manual, the jq, tmux and curl man pages), 78 of them with no answer in them
(near misses: a later release's function, a neighbouring tool's option, a default the documents do not state).
EVALUATION ONLY: nothing may be fitted, tuned or chosen on it; it says how the shipped defaults do.

Each family is a source of its own (a folder of its files: the HTML pages, the PDF, each man page as `man` prints it
for a terminal of 80 columns), built in one workspace; every question is asked of all six with the defaults
(`Workspace.ask`, extractive). Per family and in all:
- hit@1: the first passage is of the question's file; fact@5: the answer stands in the five passages;
- quoted: the quoted answer holds the answer (answerable questions, not declined);
- declined: "not found" for a question without an answer; declined wrongly: for one with an answer;
- then each sentence scorer on the same five passages, quoted by the same rules (the best two sentences): the shipped
  one (`support`), and beside it the plainest signals: plain overlap (the share of the question's content words a
  sentence holds, nothing weighed), the encoder's cosine, BM25 over the passages' sentences.
An answer "holds" the answer string when it stands in it with the hyphens of a man page's line ends joined, as a
whole word, case and white space aside; an answer of three characters or fewer ("5", "-E", "C-b") must also come
with half of its evidence sentence's content words, so that a stray digit does not count.

    python bench/reading.py            # make bench-reading: results/reading/results.{md,json}
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.eval.record import ResultsFile
from gradfuse.reading import support
from gradfuse.reading.evidence import extractive_answer

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "benchmarks" / "reading" / "questions.jsonl"
WORK = ROOT / ".gradfuse" / "bench" / "reading"
OUT = ROOT / "results" / "reading"
K = 5
SQLITE = Path("/usr/share/doc/sqlite3")
# The SQL language's pages, the pragmas and the limits (the questions' pages and their neighbours); the rest of the
# 766 pages would cost minutes of embedding and hold none of the answers.
SQLITE_PAGES = ("lang_*.html", "pragma.html", "limits.html", "datatype3.html", "foreignkeys.html", "json1.html")
FAMILIES = {"sqlite": "sqlite3-doc", "lua": "lua5.2-doc", "gnuplot": "gnuplot-doc", "jq": "jq", "tmux": "tmux",
            "curl": "curl"}
SCORERS = ("support", "plain overlap", "cosine", "bm25")


def installed_versions() -> dict[str, str]:
    """The families' packages, installed with apt-get where missing (as root), and their versions."""
    wanted = [*FAMILIES.values(), "man-db"]
    missing = [p for p in wanted if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                                   text=True).stdout.split()[-1:] != ["installed"]]
    if missing:
        if os.geteuid() != 0:
            raise SystemExit(f"install these Debian packages first: apt-get install {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env).returncode:
            subprocess.run(["apt-get", "update", "-q"], env=env, check=True)
            subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env, check=True)
    return {p: subprocess.run(["dpkg-query", "-W", "-f=${Version}", p], capture_output=True, text=True).stdout
            for p in FAMILIES.values()}


def prepare(family: str, folder: Path) -> None:
    """The family's files in `folder`, as a user's folder of them would hold them."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if family == "sqlite":
        for pattern in SQLITE_PAGES:
            for page in SQLITE.glob(pattern):
                shutil.copy(page, folder / page.name)
    elif family == "lua":
        for page in ("manual.html", "readme.html", "contents.html"):
            shutil.copy(Path("/usr/share/doc/lua5.2") / page, folder / page)
    elif family == "gnuplot":
        shutil.copy("/usr/share/doc/gnuplot/gnuplot.pdf", folder / "gnuplot.pdf")
    else:
        shown = subprocess.run(["man", "--nh", "--nj", "-P", "cat", family], capture_output=True, text=True,
                               env={**os.environ, "MANWIDTH": "80"}, check=True).stdout
        text = subprocess.run(["col", "-bx"], input=shown, capture_output=True, text=True, check=True).stdout
        (folder / f"{family}.txt").write_text(text, encoding="utf-8")


def _plain(text: str) -> str:
    text = re.sub(r"(\w)[-‐]\s*\n\s*(\w)", r"\1\2", text)  # a man page's word cut at a line's end
    return " ".join(text.casefold().split())


def holds(question: dict, text: str) -> bool:
    answer, plain = _plain(question["answer"]), _plain(text)
    if not re.search(rf"(?<![\w-]){re.escape(answer)}(?![\w])", plain):
        return False
    if len(answer) > 3:
        return True
    wanted = set(support.content_words(question["evidence"]))
    return len(wanted & set(support.content_words(text))) >= 0.5 * len(wanted)


def plain_overlap(question: str, sentences: list[str]) -> np.ndarray:
    asked = set(support.content_words(question))
    return np.array([len(asked & set(support.content_words(s))) / max(1, len(asked)) for s in sentences])


def sentence_bm25(question: str, sentences: list[str], k1: float = 1.2, b: float = 0.75) -> np.ndarray:
    words = [support.content_words(s) for s in sentences]
    mean = sum(map(len, words)) / max(1, len(words))
    holding = Counter(w for ws in words for w in set(ws))
    scores = []
    for ws in words:
        counts = Counter(ws)
        scores.append(sum(math.log(1 + (len(words) - holding[w] + 0.5) / (holding[w] + 0.5))
                          * counts[w] * (k1 + 1) / (counts[w] + k1 * (1 - b + b * len(ws) / max(mean, 1e-9)))
                          for w in set(support.content_words(question)) if counts[w]))
    return np.array(scores)


def scorer_answers(ws: Workspace, question: str, passages) -> dict[str, str]:
    """The quoted answer each sentence scorer gives from `passages`, by the same quoting rules."""
    shipped = ws.evidence(question, passages)
    answers = {"support": extractive_answer(shipped, within=support.model().second_within, question=question)}
    cosine = ws.evidence(question, passages, settings=replace(ws.config.evidence, scorer="cosine"))
    answers["cosine"] = extractive_answer(cosine, question=question)
    texts = [e.quoted() for e in shipped]
    for name, values in (("plain overlap", plain_overlap(question, texts)), ("bm25", sentence_bm25(question, texts))):
        rescored = sorted((replace(e, score=float(v)) for e, v in zip(shipped, values)),
                          key=lambda e: (-e.score, e.passage, e.span))
        answers[name] = extractive_answer(rescored, question=question)
    return answers


def ask(ws: Workspace, question: dict) -> dict:
    started = time.perf_counter()
    answer = ws.ask(question["question"], context_k=K)
    row = {"id": question["id"], "family": question["family"], "answerable": question["kind"] == "answerable",
           "declined": answer.abstained, "support": answer.support, "seconds": time.perf_counter() - started,
           "answer": answer.text}
    files = [Path(c.location.file).name if c.location else "" for c in answer.passages]
    if row["answerable"]:
        row.update({"hit@1": float(files[:1] == [Path(question["file"]).name.removesuffix(".1.gz") + ".txt"]
                                   or files[:1] == [Path(question["file"]).name]),
                    "fact@5": float(any(holds(question, c.text) for c in answer.passages[:K])),
                    "quoted": float(not answer.abstained and holds(question, answer.text))})
        for scorer, text in scorer_answers(ws, question["question"], answer.passages[:K]).items():
            row[scorer] = float(holds(question, text))
    return row


def summarise(rows: list[dict]) -> dict:
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]

    def share(values) -> float | None:
        values = list(values)
        return round(sum(values) / len(values), 3) if values else None

    summary = {"answerable": len(answerable), "no answer": len(unanswerable),
               "hit@1": share(r["hit@1"] for r in answerable), "fact@5": share(r["fact@5"] for r in answerable),
               "quoted": share(r["quoted"] for r in answerable),
               "declined": share(r["declined"] for r in unanswerable),
               "declined wrongly": share(r["declined"] for r in answerable),
               "seconds p50": round(float(np.median([r["seconds"] for r in rows])), 3)}
    for scorer in SCORERS:
        summary[f"{scorer} quoted"] = share(r[scorer] for r in answerable)
    return summary


def markdown(results: ResultsFile, versions: dict[str, str]) -> str:
    lines = ["# Reading: what the five passages hold, quoted", "",
             f"{results.provenance} 174 questions written by hand over six Debian document families "
             "(benchmarks/reading/SOURCE.md; evaluation only: nothing is fitted or chosen on them), each family a "
             "source of its own, every question asked of all six with the defaults (bench/reading.py says how). "
             "Packages: " + ", ".join(f"{p} {v}" for p, v in versions.items()) + ".", "",
             "| family | answerable | no answer | hit@1 | fact@5 | quoted | declined | declined wrongly | "
             + " | ".join(f"{s} (best 2 of the 5)" for s in SCORERS) + " |",
             "|---|" + "---:|" * (7 + len(SCORERS))]
    for name, r in results.rows.items():
        cells = [r["answerable"], r["no answer"], r["hit@1"], r["fact@5"], r["quoted"], r["declined"],
                 r["declined wrongly"], *(r[f"{s} quoted"] for s in SCORERS)]
        lines.append(f"| {name} | " + " | ".join("–" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    versions = installed_versions()
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    for q in questions:
        if versions[q["package"]] != q["version"]:
            print(f"note: {q['package']} is {versions[q['package']]} here, the questions were checked on "
                  f"{q['version']}", file=sys.stderr)
    ws = Workspace(Config(workspace=WORK / "ws"))
    for family in FAMILIES:
        prepare(family, WORK / "inputs" / family)
        print(ws.index(SourceSpec(family, "files", str(WORK / "inputs" / family)), progress=True).status, family,
              flush=True)
    results = ResultsFile.start(OUT, "make bench-reading", questions=len(questions), k=K,
                                packages=versions, evaluation_only=True)
    rows = []
    for n, question in enumerate(questions, start=1):
        rows.append(ask(ws, question))
        if n % 20 == 0:
            print(f"{n}/{len(questions)}", flush=True)
    for family in FAMILIES:
        results.add(family, summarise([r for r in rows if r["family"] == family]))
    results.add("all", summarise(rows))
    (OUT / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results.finish(markdown(results, versions))
    print(markdown(results, versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
