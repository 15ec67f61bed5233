"""The embedded demo: three sources made from text every Python install has, and questions that need each."""

from __future__ import annotations

import inspect
import json
import pydoc_data.topics
from pathlib import Path

from gradfuse.sources import SourceSpec

# Modules whose documentation the stdlib source holds: common enough that a question about them is natural.
STDLIB_MODULES = (
    "json", "csv", "pathlib", "os", "shutil", "subprocess", "re", "datetime", "collections", "itertools",
    "functools", "logging", "argparse", "sqlite3", "threading", "asyncio", "unittest", "hashlib", "random",
    "statistics", "textwrap", "tempfile", "urllib.parse", "zipfile", "gzip", "heapq", "bisect", "dataclasses",
)

QUESTIONS = (
    'What happens when the body of a "with" statement raises an exception?',
    "How do I turn a Python dictionary into a JSON string?",
    "What happens in gradfuse when one source times out?",
)

# The first questions: dense retrieval, concatenated by cosine (one encoder for every source makes the scores
# comparable), the three best passages.
FIRST_SEARCH = {"method": "concat", "retrieval": "dense", "k": 3}
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


def demo_specs(data_dir: Path) -> list[SourceSpec]:
    """The demo's sources; their input files are regenerated each run, and unchanged content rebuilds nothing."""
    reference = _write_jsonl(data_dir / "python-reference.jsonl", _language_reference())
    stdlib = _write_jsonl(data_dir / "stdlib-docs.jsonl", _stdlib_docstrings())
    return [
        SourceSpec("python-reference", "jsonl", str(reference), _CHUNKS),
        SourceSpec("stdlib-docs", "jsonl", str(stdlib), _CHUNKS),
        SourceSpec("gradfuse-docs", "files", str(PROJECT_DOCS), _CHUNKS),
    ]
