"""The embedded demo: four sources made from what every install has (Python's own documentation, gradfuse's guide
as a PDF, a spreadsheet of share prices from matplotlib's sample data), and questions that need each."""

from __future__ import annotations

import csv
import datetime
import inspect
import json
import pydoc_data.topics
import re
from dataclasses import dataclass
from pathlib import Path

from gradfuse.sources import SourceSpec

# Modules whose documentation the stdlib source holds: common enough that a question about them is natural.
STDLIB_MODULES = (
    "json", "csv", "pathlib", "os", "shutil", "subprocess", "re", "datetime", "collections", "itertools",
    "functools", "logging", "argparse", "sqlite3", "threading", "asyncio", "unittest", "hashlib", "random",
    "statistics", "textwrap", "tempfile", "urllib.parse", "zipfile", "gzip", "heapq", "bisect", "dataclasses",
)


@dataclass(frozen=True)
class DemoQuestion:
    text: str
    search: dict  # Workspace.search options; k: the passages the answer reads (`gradfuse ask --k`)
    how: str  # what the demo says about the retrieval it uses

    def flags(self) -> list[str]:
        """The options of `gradfuse ask` that ask as the demo does (the demo prints them): a user who types them
        gets its answer (issue 71: without --k 3 the "with" question quotes another sentence)."""
        return [part for key, value in self.search.items() for part in (f"--{key}", str(value))]


DEFAULT = {"k": 3}
QUESTIONS = (
    DemoQuestion('What happens when the body of a "with" statement raises an exception?', DEFAULT,
                 "the default method, select: the sources most relevant to the question are chosen, then their "
                 "passages ranked by cosine"),
    DemoQuestion("How do I turn a Python dictionary into a JSON string?", DEFAULT, "the same"),
    DemoQuestion("closing price on 2003-09-19", {"method": "rrf", "retrieval": "bm25", "k": 3},
                 "a date is found by its words, not its meaning: BM25 in every source (the date as a phrase), fused "
                 "by RRF (select ranks by the encoder's cosine, which does not match a date); a table row is "
                 "evidence on its own, quoted with its column names"),
    DemoQuestion("What happens in gradfuse when one source times out?", {"method": "gro", "k": 3},
                 "the full method, gro: stage 1 chooses the sources, then the scoring LM (UPR) ranks their passages"),
    DemoQuestion("Who won the 2018 FIFA World Cup?", DEFAULT,
                 "none of these sources holds the answer: gradfuse says so (a question close to what they do hold is "
                 "declined less often: results/answers)"),
)

_CHUNKS = {"chunk_words": 150, "chunk_overlap": 30}  # short passages: the demo generator has a small window
PROJECT_DOCS = Path(__file__).resolve().parent / "guide"  # inside the package: the demo runs from a wheel too


def _write_jsonl(path: Path, records: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


def _language_reference() -> list[dict[str, str]]:
    """One record per topic, titled by the topic's own heading (its first line, 'The "with" statement'): every
    chunk carries its title, and a chunk deep in a section still says what it is about."""
    return [
        {"id": topic, "title": f"Python language reference: {_heading(text) or topic}", "text": text}
        for topic, text in sorted(pydoc_data.topics.topics.items())
    ]


def _heading(text: str) -> str | None:
    """The first line, where the next one underlines it (reStructuredText: a row of * = or -)."""
    lines = text.splitlines()
    underlined = len(lines) > 1 and lines[1].strip() and set(lines[1].strip()) <= set("*=-")
    return lines[0].strip() if underlined else None


def _stdlib_docstrings() -> list[dict[str, str]]:
    import importlib

    records = []
    for module_name in STDLIB_MODULES:
        module = importlib.import_module(module_name)
        if module.__doc__:
            records.append({"id": module_name, "title": f"module {module_name}", "text": inspect.cleandoc(module.__doc__)})
        for name, member in sorted(vars(module).items()):
            public = not name.startswith("_") and getattr(member, "__module__", None) == module.__name__
            if public and (inspect.isfunction(member) or inspect.isclass(member)) and member.__doc__:
                qualified = f"{module_name}.{name}"
                records.append({"id": qualified, "title": qualified, "text": inspect.cleandoc(member.__doc__)})
    return records


_WRITTEN_AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)  # the same bytes every run


def _guide_pdf(path: Path) -> Path:
    """gradfuse's guide (architecture.md) as a PDF, its headings the outline, so the demo reads a real PDF."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_creation_date(_WRITTEN_AT)
    pdf.set_auto_page_break(True, margin=15)
    text = (PROJECT_DOCS / "architecture.md").read_text(encoding="utf-8").replace("—", "-")
    for block in re.split(r"\n\s*\n", text):
        heading = re.match(r"(#{1,6})\s+(.+)", block.strip())
        if heading:
            level = len(heading.group(1)) - 1
            if level <= 1:
                pdf.add_page()  # each section on pages of its own
            pdf.start_section(heading.group(2), level=level)
            pdf.set_font("Helvetica", "B", 14 - 2 * level)
            pdf.multi_cell(0, 8, heading.group(2), new_x="LMARGIN", new_y="NEXT")
        else:
            pdf.set_font("Helvetica", size=10)
            pdf.multi_cell(0, 5, " ".join(block.split()), new_x="LMARGIN", new_y="NEXT")
            pdf.ln(2)
    path.parent.mkdir(parents=True, exist_ok=True)
    pdf.output(str(path))
    return path


def _prices_workbook(path: Path) -> Path:
    """Microsoft's daily share prices of August-September 2003 (matplotlib's sample data, msft.csv, from Yahoo
    Finance) as an Excel workbook, dates as dates, so the demo reads a real spreadsheet."""
    import matplotlib
    import openpyxl

    source = Path(matplotlib.get_data_path()) / "sample_data" / "msft.csv"
    with open(source, newline="", encoding="utf-8") as handle:
        header, *rows = list(csv.reader(handle))
    book = openpyxl.Workbook()
    book.properties.created = book.properties.modified = _WRITTEN_AT.replace(tzinfo=None)
    sheet = book.active
    sheet.title = "MSFT 2003"
    sheet.append(header)
    for date, *values in rows:
        day = datetime.datetime.strptime(date, "%d-%b-%y")
        sheet.append([day, *(float(v) if "." in v else int(v) for v in values)])
    path.parent.mkdir(parents=True, exist_ok=True)
    book.save(str(path))
    return path


def demo_specs(data_dir: Path) -> list[SourceSpec]:
    """The demo's sources; their input files are regenerated each run, and unchanged content rebuilds nothing."""
    reference = _write_jsonl(data_dir / "python-reference.jsonl", _language_reference())
    stdlib = _write_jsonl(data_dir / "stdlib-docs.jsonl", _stdlib_docstrings())
    guide = _guide_pdf(data_dir / "gradfuse-docs" / "how-gradfuse-works.pdf")
    prices = _prices_workbook(data_dir / "market-data" / "msft-2003.xlsx")
    return [
        SourceSpec("python-reference", "jsonl", str(reference), _CHUNKS),
        SourceSpec("stdlib-docs", "jsonl", str(stdlib), _CHUNKS),
        SourceSpec("gradfuse-docs", "files", str(guide.parent), _CHUNKS),
        SourceSpec("market-data", "files", str(prices.parent), _CHUNKS),
    ]
