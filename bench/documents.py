"""Retrieval and evidence on real documents in five formats, with questions whose answers sit on a known page,
row, slide or section (issue 21's benchmark; `make bench-documents`).

The files (none is copied into the repository; they are written to a temporary folder at each run):
- pdf: two manuals Debian packages ship, `libtasn1.pdf` (libtasn1-doc) and `shared-mime-info-spec.pdf`
  (shared-mime-info), as installed;
- csv: Debian's release table, `debian.csv` (distro-info-data), as installed;
- xlsx: Ubuntu's release table (`ubuntu.csv` of distro-info-data) written as a workbook by openpyxl;
- docx: five statements of Python's language reference (pydoc_data), written by python-docx, each under its own
  heading;
- pptx: ten standard-library modules' docstrings (title, summary, and the rest as notes), by python-pptx.

Each format is its own source, so the set is federated. Before anything is measured, every question's answer is
checked to stand at its place in the indexed files (a question whose file is missing or changed is dropped and
counted). Reported per format: hit@1 and hit@5 (a passage from the question's place among the first k) for BM25
(RRF over the sources), dense (concatenated by cosine) and hybrid (RRF), answer-in-evidence (the gold answer
string in the best evidence sentence, and in the extractive answer, over the hybrid top 3), and indexing
throughput (pages, rows or slides per second, parse and whole build). Writes results/documents/results.{md,json}.

    python bench/documents.py
"""

from __future__ import annotations

import csv
import inspect
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.eval.qa import answer_in_context
from gradfuse.reading.evidence import extractive_answer
from gradfuse.indexing.build import FILE_CHUNK_OVERLAP, FILE_CHUNK_WORDS
from gradfuse.ingest.documents import IngestReport
from gradfuse.ingest.files import read_files
from gradfuse.eval.record import ResultsFile

OUT = Path(__file__).resolve().parents[1] / "results" / "documents"
PDFS = [Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf"), Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")]
DISTRO = Path("/usr/share/distro-info")
STATEMENTS = ("with", "try", "assert", "lambda", "global")
MODULES = ("heapq", "bisect", "shutil", "textwrap", "json", "csv", "zipfile", "gzip", "statistics", "tempfile")
METHODS = {"bm25": {"method": "rrf", "retrieval": "bm25"}, "dense": {"method": "concat", "retrieval": "dense"},
           "hybrid": {"method": "rrf", "retrieval": "hybrid"}}

# (format, file, place, question, answer): place is {"page": n}, {"row": n}, {"slide": n} or {"heading": text}.
QUESTIONS = [
    ("pdf", "libtasn1.pdf", {"page": 6}, "Which ASN.1 type does libtasn1 not handle?", "REAL"),
    ("pdf", "libtasn1.pdf", {"page": 7}, "What is the header file of the libtasn1 library?", "libtasn1.h"),
    ("pdf", "libtasn1.pdf", {"page": 4}, "Under which license can the libtasn1 library itself be redistributed?",
     "GNU Lesser General Public License version 2.1"),
    ("pdf", "libtasn1.pdf", {"page": 5}, "Are C-style comments supported by the libtasn1 ASN.1 parser?",
     "are not supported"),
    ("pdf", "libtasn1.pdf", {"page": 7}, "Which type stores the ASN.1 definitions and structures in libtasn1?",
     "asn1_node"),
    ("pdf", "shared-mime-info-spec.pdf", {"page": 1}, "Which version of the Shared MIME-info Database "
     "specification is this?", "0.21"),
    ("pdf", "shared-mime-info-spec.pdf", {"page": 3}, "Which command must an application run after installing "
     "its MIME XML file?", "update-mime-database"),
    ("pdf", "shared-mime-info-spec.pdf", {"page": 4}, "What is the default weight of a glob pattern?", "50"),
    ("pdf", "shared-mime-info-spec.pdf", {"page": 3}, "Which file takes precedence over all other files in the "
     "same packages directory?", "Override.xml"),
    ("pdf", "shared-mime-info-spec.pdf", {"page": 5}, "Which alias does the audio/midi MIME type have?",
     "audio/x-midi"),
    ("csv", "debian.csv", {"row": 16}, "When was Debian 10 buster released?", "2019-07-06"),
    ("csv", "debian.csv", {"row": 5}, "What is the codename of Debian 2.0?", "Hamm"),
    ("csv", "debian.csv", {"row": 14}, "When did Debian 8 jessie reach its end of life?", "2018-06-17"),
    ("csv", "debian.csv", {"row": 18}, "When was Debian 12 bookworm released?", "2023-06-10"),
    ("csv", "debian.csv", {"row": 10}, "Which Debian version was codenamed Etch?", "4.0"),
    ("xlsx", "ubuntu.xlsx", {"row": 33}, "When was Ubuntu 20.04 LTS Focal Fossa released?", "2020-04-23"),
    ("xlsx", "ubuntu.xlsx", {"row": 2}, "What was the codename of Ubuntu 4.10?", "Warty Warthog"),
    ("xlsx", "ubuntu.xlsx", {"row": 29}, "When does standard support for Ubuntu 18.04 Bionic Beaver end?",
     "2023-05-31"),
    ("xlsx", "ubuntu.xlsx", {"row": 37}, "Which Ubuntu version is Jammy Jellyfish?", "22.04 LTS"),
    ("xlsx", "ubuntu.xlsx", {"row": 41}, "When was Ubuntu 24.04 Noble Numbat released?", "2024-04-25"),
    ("docx", "python-statements.docx", {"heading": 'The "assert" statement'},
     "What exception does a failing assert statement raise?", "AssertionError"),
    ("docx", "python-statements.docx", {"heading": "Lambdas"}, "What kind of functions do lambda expressions "
     "create?", "anonymous functions"),
    ("docx", "python-statements.docx", {"heading": 'The "with" statement'}, "What does the with statement wrap "
     "the execution of a block with?", "methods defined by a context manager"),
    ("docx", "python-statements.docx", {"heading": 'The "try" statement'}, "What does the try statement specify "
     "for a group of statements?", "exception handlers and/or cleanup code"),
    ("docx", "python-statements.docx", {"heading": 'The "global" statement'}, "Which statement declares that "
     "identifiers are to be interpreted as globals?", "global"),
    ("pptx", "stdlib-modules.pptx", {"slide": 1}, "Which module implements the heap queue algorithm?", "heapq"),
    ("pptx", "stdlib-modules.pptx", {"slide": 3}, "Which module has utility functions for copying and archiving "
     "files and directory trees?", "shutil"),
    ("pptx", "stdlib-modules.pptx", {"slide": 5}, "Which module handles JavaScript Object Notation?", "json"),
    ("pptx", "stdlib-modules.pptx", {"slide": 7}, "Which module reads and writes ZIP files?", "zipfile"),
    ("pptx", "stdlib-modules.pptx", {"slide": 9}, "Which module is the basic statistics module?", "statistics"),
]


def write_files(folder: Path) -> dict[str, list[str]]:
    """The files of each format under folder/<format>/; returns the formats' files that could be made."""
    made: dict[str, list[str]] = {}

    def place(kind: str, name: str) -> Path:
        (folder / kind).mkdir(parents=True, exist_ok=True)
        made.setdefault(kind, []).append(name)
        return folder / kind / name

    for pdf in PDFS:
        if pdf.is_file():
            shutil.copy(pdf, place("pdf", pdf.name))
    if (DISTRO / "debian.csv").is_file():
        shutil.copy(DISTRO / "debian.csv", place("csv", "debian.csv"))
    if (DISTRO / "ubuntu.csv").is_file():
        import openpyxl

        book = openpyxl.Workbook()
        sheet = book.active
        sheet.title = "ubuntu"
        with open(DISTRO / "ubuntu.csv", newline="", encoding="utf-8") as handle:
            for row in csv.reader(handle):
                sheet.append(row)
        book.save(str(place("xlsx", "ubuntu.xlsx")))
    import docx
    import pydoc_data.topics

    document = docx.Document()
    for topic in STATEMENTS:
        text = pydoc_data.topics.topics[topic]
        heading, _, body = text.partition("\n")
        document.add_heading(heading.strip(), 1)
        for paragraph in body.split("\n\n"):
            if paragraph.strip() and not set(paragraph.strip()) <= set("*"):
                document.add_paragraph(" ".join(paragraph.split()))
    document.save(str(place("docx", "python-statements.docx")))
    import importlib

    import pptx

    deck = pptx.Presentation()
    for name in MODULES:
        summary, _, rest = inspect.cleandoc(importlib.import_module(name).__doc__ or "").partition("\n\n")
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"module {name}"
        slide.placeholders[1].text = " ".join(summary.split())
        if rest.strip():
            slide.notes_slide.notes_text_frame.text = " ".join(rest.split())[:2000]
    deck.save(str(place("pptx", "stdlib-modules.pptx")))
    return made


def at_place(passage, file: str, where: dict) -> bool:
    """Whether a candidate or a read chunk stands at the question's place."""
    location = passage.location
    if location is None or location.file != file:
        return False
    if "page" in where:
        return location.page == where["page"]
    if "slide" in where:
        return location.slide == where["slide"]
    if "row" in where:
        return location.rows is not None and location.rows[0] <= where["row"] <= location.rows[1]
    return where["heading"] in location.headings


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "files"
        made = write_files(folder)
        ws = Workspace(Config(workspace=Path(scratch) / "ws"))
        builds, chunks = {}, {}
        for kind in made:
            started = time.perf_counter()  # what the build reads: the same readers, chunks and locations
            chunks[kind] = list(read_files(folder / kind, IngestReport(), words=FILE_CHUNK_WORDS,
                                           overlap=FILE_CHUNK_OVERLAP))
            parse = time.perf_counter() - started
            started = time.perf_counter()
            built = ws.index(SourceSpec(kind, "files", str(folder / kind)))
            seconds = time.perf_counter() - started
            units = _units(chunks[kind], kind)
            builds[kind] = {"files": len(made[kind]), "chunks": built.documents, "units": units,
                            "parse_seconds": parse, "seconds": seconds, "parse_units_per_second": units / parse,
                            "units_per_second": units / seconds, "skipped": built.skipped}
        usable, dropped = [], []
        for question in QUESTIONS:
            kind, file, where, text, answer = question
            standing = [d.text for d in chunks.get(kind, []) if at_place(d, file, where)]
            if answer_in_context((answer,), standing) == 1.0:
                usable.append(question)
            else:
                dropped.append(text)
        results = ResultsFile.start(OUT, "make bench-documents", questions=len(usable), dropped_questions=dropped)
        for kind in made:  # every source is built before any is asked: the set is federated
            rows = [measure(ws, question) for question in usable if question[0] == kind]
            results.add(kind, {"build": builds[kind], "questions": len(rows), **means(rows)})
    results.finish(report(results))
    print(report(results))


def _units(chunks, kind: str) -> int:
    """Pages, slides, rows or sections read, from the chunks' locations."""
    locations = [c.location for c in chunks if c.location is not None]
    if kind == "pdf":
        return len({(loc.file, loc.page) for loc in locations})
    if kind == "pptx":
        return len({(loc.file, loc.slide) for loc in locations})
    if kind in ("csv", "xlsx"):
        return sum(loc.rows[1] - loc.rows[0] + 1 for loc in locations if loc.rows)
    return len({(loc.file, loc.headings) for loc in locations})


def measure(ws, question) -> dict:
    kind, file, where, text, answer = question
    row = {}
    own = {f"{retrieval} own": {"method": f"single:{kind}", "retrieval": retrieval} for retrieval in ("bm25", "dense")}
    for name, options in {**METHODS, **own}.items():
        ranked = ws.search(text, k=5, **options).candidates
        hits = [at_place(c, file, where) for c in ranked]
        row[f"{name} hit@1"] = float(any(hits[:1]))
        row[f"{name} hit@5"] = float(any(hits[:5]))
    top = ws.search(text, k=3, **METHODS["hybrid"]).candidates
    evidence = ws.evidence(text, top)
    row["evidence@1"] = answer_in_context((answer,), [evidence[0].text]) if evidence else 0.0
    row["extractive"] = answer_in_context((answer,), [extractive_answer(evidence)]) if evidence else 0.0
    return row


def means(rows: list[dict]) -> dict:
    """Each value's mean over the questions' rows (none where a format has no question left)."""
    return {k: float(np.mean([r[k] for r in rows])) for k in (rows[0] if rows else [])}


def per_format(results: ResultsFile) -> dict:
    """Each format with questions, then "all": every question's mean (the formats' means weighted by questions)."""
    per = {kind: {k: v for k, v in row.items() if k != "build"} for kind, row in results.rows.items()
           if row["questions"]}
    total = sum(row["questions"] for row in per.values())
    keys = [k for k in next(iter(per.values()), {}) if k != "questions"]
    if total:
        per["all"] = {"questions": total, **{k: sum(r[k] * r["questions"] for r in per.values()) / total for k in keys}}
    return per


def report(results: ResultsFile) -> str:
    per = per_format(results)
    keys = [k for k in next(iter(per.values())) if k != "questions"] if per else []
    dropped = results.header["dropped_questions"]
    lines = ["# Real documents: retrieval and evidence per format", "",
             f"{results.provenance} Two PDF manuals Debian packages ship, Debian's "
             "release table (CSV), Ubuntu's as a workbook (openpyxl), five statements of Python's language "
             "reference as a Word file (python-docx), ten standard-library modules as slides (python-pptx); each "
             "format one source. A hit is a passage from the question's page, row, slide or section among the first k "
             "of all five sources (`bm25`, `hybrid`: RRF, which puts every source's first passage near the top; "
             "`dense`: concatenated by cosine) or of the question's own source alone (`own`: what the reader and "
             "the index do for that format). Evidence: the hybrid top 3 over all sources, the shipped "
             f"`[evidence]` scorer. {results.header['questions']} questions"
             + (f"; dropped (their file missing or changed): {len(dropped)}" if dropped else "") + ".", "",
             "| format | questions | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys)]
    for kind, row in per.items():
        lines.append(f"| {kind} | {row['questions']} | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")
    lines += ["", "Indexing (each format's folder as one source, from nothing: parse, chunk, embed, index; the parse "
              "seconds include starting the parser's worker process, about 1.2 s, which these small sets are "
              "dominated by):", "",
              "| format | files | units | chunks | parse s | build s | units / s (parse) | units / s (build) | skipped |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    units = {"pdf": "pages", "pptx": "slides", "csv": "rows", "xlsx": "rows", "docx": "sections"}
    for kind, row in results.rows.items():
        build = row["build"]
        lines.append(f"| {kind} | {build['files']} | {build['units']} {units.get(kind, '')} | {build['chunks']} | "
                     f"{build['parse_seconds']:.1f} | {build['seconds']:.1f} | {build['parse_units_per_second']:.0f} | "
                     f"{build['units_per_second']:.1f} | {len(build['skipped'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
