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
  sentence holds, nothing weighed), rarity-weighted overlap (`support`'s signal before issue 70), the encoder's
  cosine, BM25 over the passages' sentences; and, where `make train-reader` has made it, the reader trained here
  alone (reading/READER.md: `scorer = "reader"`), which ships only where it beats plain overlap on every family
  (issue 70 item 5).
- what an LLM reads of the five passages (`[generator] context`, by an endpoint's count of tokens): the fact inside
  the windows around the evidence (the default), and inside each passage's first 600 characters (the prompt before
  issue 70), measured with no LLM;
- with `--llm qwen0.5b` (`make bench-reading-llm`: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, behind llama.cpp's
  OpenAI-compatible server: bench/llm_server.py): each question answered by it as well, and the written answer's rows: it holds the fact, it was declined,
  it cites a passage (as the LLM wrote it, and after attribution), a cited passage holds the fact, it is marked
  unsupported.
An answer "holds" the answer string when it stands in it with the hyphens of a man page's line ends joined, as a
whole word, case and white space aside; an answer of three characters or fewer ("5", "-E", "C-b") must also come
with half of its evidence sentence's content words, so that a stray digit does not count.

    python bench/reading.py            # make bench-reading: results/reading/results.{md,json}
    python bench/reading.py --out results/reading/avx2   # another CPU's run beside it
    python bench/reading.py --llm qwen0.5b --out results/reading/llm-qwen0.5b   # make bench-reading-llm
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np

from llm_server import GGUFS, LICENCE, served

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.eval.record import ResultsFile
from gradfuse.generate import parse_citations
from gradfuse.generate.openai_http import CHARS_PER_TOKEN
from gradfuse.reading import support
from gradfuse.reading.context import windows
from gradfuse.reading.evidence import extractive_answer
from gradfuse.reading.reader import READER_FILE

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "benchmarks" / "reading" / "questions.jsonl"
WORK = ROOT / ".gradfuse" / "bench" / "reading"
WORKSPACE = WORK / "ws"
OUT = ROOT / "results" / "reading"
K = 5
SQLITE = Path("/usr/share/doc/sqlite3")
# The SQL language's pages, the pragmas and the limits (the questions' pages and their neighbours); the rest of the
# 766 pages would cost minutes of embedding and hold none of the answers.
SQLITE_PAGES = ("lang_*.html", "pragma.html", "limits.html", "datatype3.html", "foreignkeys.html", "json1.html")
FAMILIES = {"sqlite": "sqlite3-doc", "lua": "lua5.2-doc", "gnuplot": "gnuplot-doc", "jq": "jq", "tmux": "tmux",
            "curl": "curl"}
# The reader trained here where `make train-reader` has made one: it is not shipped until it wins (READER.md).
SCORERS = ("support", "plain overlap", "rarity overlap", "cosine", "bm25") + (
    ("reader",) if READER_FILE.is_file() else ())
BEFORE_CHARS = 600  # what the prompt showed of each passage before issue 70
LLM_ROWS = ("written holds", "declined", "declined wrongly", "cites as written", "cites", "cited holds",
            "unsupported")


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


def built(config: Config) -> Workspace:
    """The six families' workspace (WORKSPACE), each family a folder source, brought up to date."""
    ws = Workspace(config)
    for family in FAMILIES:
        prepare(family, WORK / "inputs" / family)
        print(ws.index(SourceSpec(family, "files", str(WORK / "inputs" / family)), progress=True).status, family,
              flush=True)
    return ws


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
    if "reader" in SCORERS:
        reader = ws.evidence(question, passages, settings=replace(ws.config.evidence, scorer="reader"))
        answers["reader"] = extractive_answer(reader, question=question)
    texts = [e.quoted() for e in shipped]
    overlaps = support.signals(question, texts, np.zeros(len(texts)), [e.passage for e in shipped],
                               only=("plain", "overlap"))
    for name, values in (("plain overlap", overlaps["plain"]), ("rarity overlap", overlaps["overlap"]),
                         ("bm25", sentence_bm25(question, texts))):
        rescored = sorted((replace(e, score=float(v)) for e, v in zip(shipped, values)),
                          key=lambda e: (-e.score, e.passage, e.span))
        answers[name] = extractive_answer(rescored, question=question)
    return answers


def read_by_llm(ws: Workspace, question: str, passages) -> dict[str, str]:
    """What an LLM reads of `passages`: windows around the evidence within the default budget (counted as an
    endpoint's tokens are), and each passage's first 600 characters (before issue 70)."""
    kept = windows(ws.evidence(question, passages), passages, lambda text: max(1, len(text) // CHARS_PER_TOKEN),
                   ws.config.window_tokens)
    return {"windows": "\n".join(w for number in sorted(kept) for w in kept[number]),
            "first 600": "\n".join(c.text[:BEFORE_CHARS] for c in passages)}


def written(ws: Workspace, question: dict, generator: str, quoted_declined: bool) -> dict:
    """The rows of the answer `generator` writes (see the module's text)."""
    answer = ws.ask(question["question"], context_k=K, generator=generator)
    markers = parse_citations(answer.written or "", answer.passages)[0]  # as the LLM wrote them
    row = {"llm answer": answer.text, "llm written": answer.written, "llm declined": answer.abstained, "same decline": answer.abstained ==
           quoted_declined, "llm seconds": answer.timings.get("generation"),
           "llm unsupported": float(answer.unsupported) if not answer.abstained else None,
           "llm cites as written": float(bool(markers)) if not answer.abstained else None,
           "llm cites": float(bool(answer.citations) and not answer.unsupported) if not answer.abstained else None,
           "llm replaced": float(not answer.statements) if not answer.abstained else None}
    if question["kind"] == "answerable":
        row["llm holds"] = float(not answer.abstained and holds(question, answer.text))
        cited = [answer.passages[c.number - 1] for c in answer.citations]
        row["llm cited holds"] = float(any(holds(question, p.text) for p in cited)) if row["llm holds"] else None
    return row


def ask(ws: Workspace, question: dict, generator: str | None) -> dict:
    started = time.perf_counter()
    answer = ws.ask(question["question"], context_k=K)
    row = {"id": question["id"], "family": question["family"], "answerable": question["kind"] == "answerable",
           "declined": answer.abstained, "support": answer.support, "seconds": time.perf_counter() - started,
           "answer": answer.text}
    if generator:
        row.update(written(ws, question, generator, answer.abstained))
    files = [Path(c.location.file).name if c.location else "" for c in answer.passages]
    if row["answerable"]:
        row.update({"hit@1": float(files[:1] == [Path(question["file"]).name.removesuffix(".1.gz") + ".txt"]
                                   or files[:1] == [Path(question["file"]).name]),
                    "fact@5": float(any(holds(question, c.text) for c in answer.passages[:K])),
                    "quoted": float(not answer.abstained and holds(question, answer.text))})
        for scorer, text in scorer_answers(ws, question["question"], answer.passages[:K]).items():
            row[scorer] = float(holds(question, text))
        for context, text in read_by_llm(ws, question["question"], answer.passages[:K]).items():
            row[f"fact in {context}"] = float(holds(question, text))
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
    for context in ("windows", "first 600"):
        summary[f"fact in {context}"] = share(r[f"fact in {context}"] for r in answerable)
    if any("llm answer" in r for r in rows):
        written_rows = [r for r in rows if not r["llm declined"]]
        summary.update({
            "written holds": share(r["llm holds"] for r in answerable),
            "declined": share(r["llm declined"] for r in unanswerable),
            "declined wrongly": share(r["llm declined"] for r in answerable),
            "same decline as quoted": share(r["same decline"] for r in rows),
            "cites as written": share(r["llm cites as written"] for r in written_rows),
            "cites": share(r["llm cites"] for r in written_rows),
            "replaced by quotes": share(r["llm replaced"] for r in written_rows),
            "cited holds": share(r["llm cited holds"] for r in answerable if r["llm cited holds"] is not None),
            "unsupported": share(r["llm unsupported"] for r in written_rows),
            "generation seconds p50": round(float(np.median([r["llm seconds"] for r in written_rows])), 2)
            if written_rows else None})
    return summary


def _table(results: ResultsFile, columns: list[tuple[str, str]]) -> list[str]:
    lines = ["| family | " + " | ".join(title for title, _ in columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, r in results.rows.items():
        cells = [r.get(key) for _, key in columns]
        lines.append(f"| {name} | " + " | ".join("–" if c is None else str(c) for c in cells) + " |")
    return lines


def markdown(results: ResultsFile, versions: dict[str, str], generator: str | None) -> str:
    lines = ["# Reading: what the five passages hold, quoted" + (" and written by an LLM" if generator else ""), "",
             f"{results.provenance} 174 questions written by hand over six Debian document families "
             "(benchmarks/reading/SOURCE.md; evaluation only: nothing is fitted or chosen on them), each family a "
             "source of its own, every question asked of all six with the defaults (bench/reading.py says how). "
             "Packages: " + ", ".join(f"{p} {v}" for p, v in versions.items()) + ".", "",
             *_table(results, [("answerable", "answerable"), ("no answer", "no answer"), ("hit@1", "hit@1"),
                               ("fact@5", "fact@5"), ("quoted", "quoted"), ("declined", "declined"),
                               ("declined wrongly", "declined wrongly"),
                               *((f"{s} (best 2 of the 5)", f"{s} quoted") for s in SCORERS)]),
             "", "What an LLM reads of the five passages (answerable questions; no LLM needed): the fact inside the "
             "windows around the evidence (`[generator] context = \"windows\"`, the default, "
             f"{results.header.get('window_tokens')} tokens) and inside each passage's first {BEFORE_CHARS} "
             "characters (the prompt before issue 70), beside fact@5.", "",
             *_table(results, [("fact@5", "fact@5"), ("fact in windows", "fact in windows"),
                               ("fact in first 600", "fact in first 600")])]
    if generator:
        lines += ["", f"Written by {results.header.get('llm')} behind llama.cpp's server: the written answer "
                  "holds the fact (answerable); \"not found\" (no answer; answerable: wrongly), the same decision as "
                  "the quoted answer's; of the answers written (not declined): a citation as the LLM wrote it, a "
                  "citation after attribution on a sentence the passages support, replaced by the quoted sentences "
                  "(markers alone), marked unsupported; of the right ones, a cited passage holds the fact.",
                  "", *_table(results, [("written holds", "written holds"), ("declined", "declined"),
                                        ("declined wrongly", "declined wrongly"),
                                        ("same decline as quoted", "same decline as quoted"),
                                        ("cites as written", "cites as written"), ("cites support", "cites"),
                                        ("replaced by quotes", "replaced by quotes"),
                                        ("cited holds", "cited holds"), ("unsupported", "unsupported"),
                                        ("generation s p50", "generation seconds p50")])]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where the results go (another CPU's run beside them)")
    parser.add_argument("--llm", choices=sorted(GGUFS), help="an LLM served by llama.cpp writes answers too")
    args = parser.parse_args()
    with served(args.llm) if args.llm else nullcontext() as generator:
        return run(args.out.resolve(), args.llm, generator)


def run(out: Path, llm: str | None, generator: str | None) -> int:
    versions = installed_versions()
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    for q in questions:
        if versions[q["package"]] != q["version"]:
            print(f"note: {q['package']} is {versions[q['package']]} here, the questions were checked on "
                  f"{q['version']}", file=sys.stderr)
    ws = built(Config(workspace=WORKSPACE, api_key_env="LLM_KEY" if generator else ""))
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    command = " ".join([*([f"ATEN_CPU_CAPABILITY={capability}"] if capability else []), "python bench/reading.py", *([f"--llm {llm}"] if llm else []),
                        *([f"--out {out.relative_to(ROOT)}"] if out != OUT else [])])
    results = ResultsFile.start(out, command, questions=len(questions), k=K, packages=versions,
                                evaluation_only=True, window_tokens=ws.config.window_tokens,
                                cpu_capability=capability or "native",
                                **({"llm": f"{GGUFS[llm][0]}, {LICENCE}"} if llm else {}))
    rows = []
    for n, question in enumerate(questions, start=1):
        rows.append(ask(ws, question, generator))
        if n % 20 == 0:
            print(f"{n}/{len(questions)}", flush=True)
    for family in FAMILIES:
        results.add(family, summarise([r for r in rows if r["family"] == family]))
    results.add("all", summarise(rows))
    (out / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results.finish(markdown(results, versions, generator))
    print(markdown(results, versions, generator))
    return 0


if __name__ == "__main__":
    sys.exit(main())
