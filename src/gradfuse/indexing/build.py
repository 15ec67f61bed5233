"""Build (or skip rebuilding) one source from its spec into a new version folder, then publish it atomically."""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import hashlib
import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gradfuse.access import InvalidReader, reader_rules
from gradfuse.folders import private_folder
from gradfuse.sources.base import (
    FORMAT_VERSION,
    SourceSpec,
    current_version,
    publish_version,
    read_manifest,
    write_manifest,
)
from gradfuse.sources.docstore import write_documents
from gradfuse.ingest.documents import (
    CHARS_PER_WORD,
    Document,
    IngestError,
    IngestReport,
    chunk_documents,
    read_beir_corpus,
    read_jsonl,
)
from gradfuse.sources.embedded import write_embedded_index
from gradfuse.ingest.files import read_files
from gradfuse.ingest.readers import LIMIT_OPTIONS, ReaderLimits
from gradfuse.embedding.encoder import EmbeddingCache, load_encoder
from gradfuse.embedding.encoder_names import encoder_name, recorded_encoder
from gradfuse.indexing.lock import source_lock
from gradfuse.sources.run import run_doc_ids, write_run_tables

FILE_CHUNK_WORDS, FILE_CHUNK_OVERLAP = 200, 40
# A record longer than this is cut as files are (no passage of the shared data comes near it): one 10 MB record
# would otherwise be returned whole by every search that hits it.
LONG_RECORD_WORDS = 2000


@dataclass
class BuildReport:
    name: str
    status: str  # "built" or "unchanged"
    documents: int
    seconds: float
    embedded_now: int = 0  # vectors computed in this build; the rest came from the cache
    ingest: dict[str, int] = field(default_factory=dict)
    formats: dict[str, int] = field(default_factory=dict)  # files read, by format (files sources)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (file, reason, detail) of unreadable ones
    cut: list[str] = field(default_factory=list)  # what was read only in part, to a limit ("file: what (option)")
    written: int | None = None  # rows inserted or updated (sources in a database)
    deleted: int | None = None  # rows removed because their document left the input
    encoder: str = ""  # what embedded the passages: the encoder's name and backend
    notes: list[str] = field(default_factory=list)  # why it was rebuilt whole, or ran slower than it could

    @property
    def skipped_by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, reason, _ in self.skipped:
            counts[reason] = counts.get(reason, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else float("inf")


def read_documents(spec: SourceSpec, report: IngestReport, cache: Path | None = None) -> list[Document]:
    """The documents of a spec's input, with the reader options and chunking it asks for (`cache`: where parsed
    files are kept)."""
    path, options = Path(spec.path), spec.options
    skip = bool(options.get("skip_malformed", False))
    readers_field = options.get("readers_field", "readers")
    if spec.kind == "beir":
        documents = read_beir_corpus(path, report, readers_field=readers_field, skip_malformed=skip)
    elif spec.kind == "jsonl":
        if not path.is_file():
            raise IngestError(f"{path} is not a file")
        fields = {k: options[k] for k in ("id_field", "text_field", "title_field") if k in options}
        documents = read_jsonl(path, report, skip_malformed=skip, readers_field=readers_field, **fields)
    elif spec.kind == "files":
        # Files are always chunked (a file can be a book), inside each page, section, slide or sheet.
        words = options.get("chunk_words", FILE_CHUNK_WORDS)
        overlap = options.get("chunk_overlap", min(FILE_CHUNK_OVERLAP, words // 4))
        limits = ReaderLimits(**{k: options[k] for k in LIMIT_OPTIONS if k in options})
        files = read_files(path, report, words=words, overlap=overlap, limits=limits, cache=cache,
                           links_outside=bool(options.get("links_outside", False)))
        return list(with_file_readers(files, options.get("readers", {}), report, path))
    else:
        # A run source keeps only the corpus documents its run ranks: the rest could never be returned.
        wanted = run_doc_ids(path)
        corpus = read_jsonl(Path(options["corpus"]), report, skip_malformed=skip, readers_field=readers_field)
        return [d for d in corpus if d.doc_id in wanted]
    if "id_prefix" in options:  # one collection as several sources (e.g. TAT-QA's tables and its paragraphs)
        documents = (d for d in documents if d.doc_id.startswith(options["id_prefix"]))
    # Records are chunked only when asked, since they usually are passages.
    words = options.get("chunk_words")
    if words:
        overlap = options.get("chunk_overlap", min(FILE_CHUNK_OVERLAP, words // 4))
        return list(chunk_documents(documents, words=words, overlap=overlap))
    return list(_chunk_long_records(documents, report))


def with_file_readers(documents, rules: object, report: IngestReport, folder: Path):
    """Files' passages with the readers of the last rule whose pattern matches the file's path in `folder`
    (`[sources.NAME.readers]`: "hr/*" = ["hr"]; `*` matches across folders, as in a .gitignore the last match
    wins); a file no rule matches is for every reader of the source. A file read through a link has the readers of
    the path it leads to (a link in public/ to hr/pay.md is hr's). A pattern no file matches is reported: a
    misspelt folder would leave its files open."""
    try:
        checked = reader_rules(rules)
    except InvalidReader as error:
        raise IngestError(str(error)) from None
    unmatched, root = dict.fromkeys(rules), folder.resolve()
    documents = list(documents)
    readers_of: dict[str, tuple[str, ...]] = {}
    for file in dict.fromkeys(d.parent_id or "" for d in documents):  # once a file, not once a chunk
        matched = [(pattern, names) for pattern, names in checked
                   if fnmatch.fnmatchcase(_rule_path(root, file), pattern)]
        for pattern, _ in matched:
            unmatched.pop(pattern, None)
        readers_of[file] = matched[-1][1] if matched else ()
    refused = _hard_links_across_readers(root, readers_of)
    for file, other in refused.items():
        report.skipped_unreadable.append((file, "hard link", f"the same file as {other}, whose readers differ: "
                                          "neither is indexed (a symbolic link or a copy keeps each path's readers)"))
    for document in documents:
        file = document.parent_id or ""
        if file not in refused:
            yield dataclasses.replace(document, readers=readers_of[file]) if readers_of[file] else document
    report.unmatched_readers.extend(unmatched)


def _hard_links_across_readers(root: Path, readers_of: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Files hard-linked to another path of the folder whose readers differ, each with one such path: a hard link
    of hr/pay.md placed in public/ would otherwise take public/'s readers (a symbolic link is followed, and takes
    its target's: `_rule_path`)."""
    by_inode: dict[tuple[int, int], list[str]] = {}
    for file in readers_of:
        try:
            found = os.stat(root / file)
        except OSError:
            continue
        if found.st_nlink > 1:
            by_inode.setdefault((found.st_dev, found.st_ino), []).append(file)
    refused = {}
    for paths in by_inode.values():
        if len({readers_of[path] for path in paths}) > 1:
            refused.update({path: next(p for p in paths if readers_of[p] != readers_of[path]) for path in paths})
    return refused


def _rule_path(root: Path, relative: str) -> str:
    """The path in the folder a file's readers are decided by: where a link leads, when that is in the folder."""
    target = (root / relative).resolve()
    return target.relative_to(root).as_posix() if target.is_relative_to(root) else relative


def _chunk_long_records(documents, report: IngestReport):
    for document in documents:
        short = len(document.text) <= LONG_RECORD_WORDS * CHARS_PER_WORD  # a record without spaces is long too
        if short and len(document.text.split(maxsplit=LONG_RECORD_WORDS)) <= LONG_RECORD_WORDS:
            yield document
            continue
        report.chunked_long_records.append(document.doc_id)
        yield from chunk_documents([document], words=FILE_CHUNK_WORDS, overlap=FILE_CHUNK_OVERLAP)


def _disk_full(error: BaseException) -> bool:
    return ((isinstance(error, OSError) and error.errno == errno.ENOSPC)
            or (isinstance(error, sqlite3.OperationalError) and "disk is full" in str(error)))


def _run_inputs(spec: SourceSpec) -> tuple[Path, Path]:
    corpus = Path(spec.options["corpus"])
    queries = Path(spec.options.get("queries") or corpus.parent / "queries.jsonl")
    for needed in (Path(spec.path), corpus, queries):
        if not needed.is_file():
            raise IngestError(f"run source {spec.name!r}: {needed} does not exist")
    return corpus, queries


def _fingerprint(spec: SourceSpec, encoder: str, documents: list[Document], extra_files: list[Path]) -> str:
    digest = hashlib.sha256(json.dumps([FORMAT_VERSION, spec.kind, spec.options, encoder], sort_keys=True).encode())
    for d in documents:
        # readers only where there are some: a source without them keeps the fingerprint it was built with
        digest.update(json.dumps([d.doc_id, d.title, d.text, d.parent_id, d.span,
                                  d.location.to_json() if d.location else None, *([d.readers] if d.readers else [])
                                  ]).encode())
    for path in extra_files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_source(workspace: Path, spec: SourceSpec, *, encoder: str, progress: bool = False,
                 wait: bool = False) -> BuildReport:
    """Build `spec` and publish it as the source's current version, unless its inputs are unchanged. One build
    of a source at a time (`wait`: wait for another to finish instead of failing)."""
    with source_lock(workspace / "sources" / spec.name, spec.name, wait=wait):
        return _build(workspace, spec, encoder, progress)


def _build(workspace: Path, spec: SourceSpec, encoder: str, progress: bool) -> BuildReport:
    started = time.perf_counter()
    encoder = encoder_name(encoder)
    if spec.kind == "run":
        corpus, queries = _run_inputs(spec)
    source_dir = workspace / "sources" / spec.name
    report = IngestReport()
    for shared in (workspace / "cache" / "parsed").glob("*.json"):  # before version 3, one folder for all sources
        shared.unlink(missing_ok=True)
    documents = read_documents(spec, report, workspace / "cache" / "parsed" / spec.name)
    notes = [f"readers pattern {pattern!r} matches no file: the files it was meant for are open to every reader "
             "of the source" for pattern in report.unmatched_readers]
    if spec.options.get("readers_field") and not any(d.readers for d in documents):  # a misspelt field, likely
        notes.append(f"no record names readers in field {spec.options['readers_field']!r} (readers_field): every "
                     "document is open to every reader of the source")
    if not documents:
        skipped = "".join(f"\n  {name}: {reason} ({detail})" for name, reason, detail in report.skipped_unreadable)
        raise IngestError(f"source {spec.name!r}: {spec.path} holds no documents"
                          + (f"; files skipped:{skipped}" if skipped else ""))
    extra = [Path(spec.path), queries] if spec.kind == "run" else []
    fingerprint = _fingerprint(spec, encoder, documents, extra)

    previous = current_version(source_dir)
    if previous is not None and read_manifest(previous).get("fingerprint") == fingerprint:
        return BuildReport(spec.name, "unchanged", len(documents), time.perf_counter() - started,
                           **report.details(), notes=notes)

    private_folder(source_dir, up_to=workspace)
    for stale in source_dir.glob("build-*"):  # left by a build that was killed: this one holds the lock now
        shutil.rmtree(stale, ignore_errors=True)
    stamp = datetime.now(timezone.utc)
    building = source_dir / f"build-{stamp:%Y%m%dT%H%M%S%f}-{os.getpid()}"
    building.mkdir()
    try:
        count = write_documents(building / "docs.sqlite", documents)
        manifest = {
            "name": spec.name,
            "kind": spec.kind,
            "input": str(Path(spec.path).resolve()),
            "options": spec.options,
            "documents": count,
            "restricted": sum(1 for d in documents if d.readers),  # documents that name their readers
            "fingerprint": fingerprint,
            "built_at": stamp.isoformat(timespec="seconds"),
            "format_version": FORMAT_VERSION,
            "ingest": report.summary(),
            "encoder": None,
        }
        embedded_now, described = 0, ""
        before = read_manifest(previous).get("encoder") if previous is not None else None
        if spec.kind != "run" and before and recorded_encoder(before) != encoder:
            before = recorded_encoder(before)
            notes.append(f"its encoder changed from {before} to {encoder}: every passage is embedded again")
        if spec.kind == "run":
            manifest.update(write_run_tables(building, Path(spec.path), queries, report))
            manifest["corpus"] = str(corpus.resolve())
        else:
            model = load_encoder(encoder)
            described, notes = model.describe(), [*notes, *filter(None, [model.note])]
            cache = EmbeddingCache(workspace / "cache" / "embeddings.sqlite", model)
            try:
                embedded_now = write_embedded_index(building, documents, cache, progress)
            finally:
                cache.close()
            manifest["encoder"] = encoder
        write_manifest(building, manifest)
        version = building.with_name("v-" + building.name.removeprefix("build-"))
        building.rename(version)
        publish_version(source_dir, version)
    except BaseException as error:
        shutil.rmtree(building, ignore_errors=True)
        if _disk_full(error):
            raise IngestError(f"source {spec.name!r}: the disk is full (building in {source_dir}): free some "
                              "space and index again; the published version is unchanged") from None
        raise
    return BuildReport(spec.name, "built", count, time.perf_counter() - started, embedded_now, **report.details(),
                       encoder=described, notes=notes)
