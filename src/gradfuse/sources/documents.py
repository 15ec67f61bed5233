"""Readers that turn user inputs (BEIR folders, JSONL, plain files) into typed documents."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bs4 import BeautifulSoup


class IngestError(ValueError):
    """An input cannot be read; the message names the file (and line) at fault."""


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: str
    text: str
    title: str = ""
    parent_id: str | None = None
    span: tuple[int, int] | None = None


@dataclass
class IngestReport:
    """What a reader skipped or had to repair, so nothing is dropped silently."""

    skipped_empty: list[str] = field(default_factory=list)
    skipped_malformed: list[str] = field(default_factory=list)
    decoded_with_fallback: list[str] = field(default_factory=list)
    skipped_links_outside: list[str] = field(default_factory=list)  # links that lead out of the indexed folder

    def summary(self) -> dict[str, int]:
        return {
            "skipped_empty": len(self.skipped_empty),
            "skipped_malformed": len(self.skipped_malformed),
            "decoded_with_fallback": len(self.decoded_with_fallback),
            "skipped_links_outside": len(self.skipped_links_outside),
        }


def read_jsonl(
    path: Path,
    report: IngestReport,
    *,
    id_field: str = "id",
    text_field: str = "text",
    title_field: str = "title",
    skip_malformed: bool = False,
) -> Iterator[Document]:
    """One document per line. A bad line raises IngestError naming file and line, or is skipped and counted."""
    with open(path, encoding="utf-8", errors="strict") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                doc_id, text = str(record[id_field]), record[text_field]
                if not isinstance(text, str):
                    raise TypeError(f"field {text_field!r} is {type(text).__name__}, not a string")
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                problem = f"{path}:{line_number}: {_describe(error)}"
                if not skip_malformed:
                    raise IngestError(problem) from error
                report.skipped_malformed.append(problem)
                continue
            title = record.get(title_field) or ""
            if not (text.strip() or title.strip()):
                report.skipped_empty.append(f"{path}:{line_number} ({doc_id})")
                continue
            yield Document(doc_id=doc_id, text=text, title=title)


def _describe(error: Exception) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"invalid JSON ({error.msg} at column {error.colno})"
    if isinstance(error, KeyError):
        return f"missing field {error.args[0]!r}"
    return str(error)


def read_beir_corpus(folder: Path, report: IngestReport, *, skip_malformed: bool = False) -> Iterator[Document]:
    corpus = folder / "corpus.jsonl"
    if not corpus.is_file():
        raise IngestError(f"{folder} is not a BEIR folder: {corpus.name} is missing")
    return read_jsonl(corpus, report, skip_malformed=skip_malformed)


FILE_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm")
_WORD = re.compile(r"\S+")


def chunk_text(text: str, *, words: int, overlap: int) -> list[tuple[int, int]]:
    """Character spans of windows of `words` words, consecutive windows sharing `overlap` words."""
    if overlap >= words:
        raise ValueError(f"overlap ({overlap}) must be smaller than the chunk size ({words} words)")
    bounds = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    spans, step = [], words - overlap
    for first in range(0, len(bounds), step):
        last = min(first + words, len(bounds)) - 1
        spans.append((bounds[first][0], bounds[last][1]))
        if last == len(bounds) - 1:
            break
    return spans


def chunk_documents(documents: Iterator[Document], *, words: int, overlap: int) -> Iterator[Document]:
    """Cut long documents into overlapping chunks (`<id>#<n>`) that keep their parent id and character span."""
    for document in documents:
        for index, (start, end) in enumerate(chunk_text(document.text, words=words, overlap=overlap)):
            yield Document(
                doc_id=f"{document.doc_id}#{index}",
                text=document.text[start:end],
                title=document.title,
                parent_id=document.doc_id,
                span=(start, end),
            )


def read_files(folder: Path, report: IngestReport, *, links_outside: bool = False) -> Iterator[Document]:
    """Every .txt/.md/.html file under `folder` as one document named by its relative path. A symbolic link that
    resolves outside the folder is skipped and reported (a link to /etc/passwd must not end up served by search)
    unless `links_outside` allows it."""
    if not folder.is_dir():
        raise IngestError(f"{folder} is not a folder")
    root = folder.resolve()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in FILE_SUFFIXES):
        relative = path.relative_to(folder).as_posix()
        if not links_outside and not path.resolve().is_relative_to(root):
            report.skipped_links_outside.append(relative)
            continue
        title, text = _read_text_file(path, relative, report)
        if not text.strip():
            report.skipped_empty.append(relative)
            continue
        yield Document(doc_id=relative, text=text, title=title)


def _read_text_file(path: Path, relative: str, report: IngestReport) -> tuple[str, str]:
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError:
        # Legacy files are usually Windows-1252; latin-1 maps every byte, so nothing is lost either way.
        try:
            content = raw.decode("cp1252")
        except UnicodeDecodeError:
            content = raw.decode("latin-1")
        report.decoded_with_fallback.append(relative)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        soup = BeautifulSoup(content, "html.parser")
        for hidden in soup(["script", "style", "noscript"]):
            hidden.decompose()
        title = soup.title.get_text(strip=True) if soup.title else path.stem
        return title, soup.get_text("\n", strip=True)
    if suffix in (".md", ".markdown"):
        heading = re.search(r"^#\s+(.+)$", content, flags=re.MULTILINE)
        return (heading.group(1).strip() if heading else path.stem), content
    return path.stem, content
