"""Build (or skip rebuilding) one source from its spec into a new version folder, then publish it atomically."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from gradfuse.embedding.encoder_names import encoder_name
from gradfuse.indexing.file_readers import with_file_readers
from gradfuse.indexing.folder_sync import (FILE_CHUNK_OVERLAP, FILE_CHUNK_WORDS, file_options, listing_options,
                                           sync_folder)
from gradfuse.indexing.lock import source_lock
from gradfuse.indexing.report import BuildReport
from gradfuse.indexing.versions import (
    embed_passages,
    encoder_change_notes,
    manifest_for,
    new_version,
    no_documents,
    unmatched_readers_notes,
)
from gradfuse.ingest.documents import (
    CHARS_PER_WORD,
    Document,
    IngestError,
    IngestReport,
    chunk_documents,
    read_beir_corpus,
    read_jsonl,
)
from gradfuse.ingest.files import read_files
from gradfuse.ingest.parts import parse_part, part_of
from gradfuse.sources.base import FORMAT_VERSION, SourceSpec, current_version, read_manifest, write_manifest
from gradfuse.sources.docstore import write_documents
from gradfuse.sources.embedded import write_embedded_index
from gradfuse.sources.run import run_doc_ids, write_run_tables

# A record longer than this is cut as files are (no passage of the shared data comes near it): one 10 MB record
# would otherwise be returned whole by every search that hits it.
LONG_RECORD_WORDS = 2000


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
        files = read_files(path, report, **file_options(options), **listing_options(options), cache=cache)
        return list(with_file_readers(files, options.get("readers", {}), report, path))
    else:
        # A run source keeps only the corpus documents its run ranks: the rest could never be returned.
        wanted = run_doc_ids(path, options.get("depth"))
        corpus = read_jsonl(Path(options["corpus"]), report, skip_malformed=skip, readers_field=readers_field)
        return [d for d in corpus if d.doc_id in wanted]
    if "id_prefix" in options:  # one collection as several sources (e.g. TAT-QA's tables and its paragraphs)
        documents = (d for d in documents if d.doc_id.startswith(options["id_prefix"]))
    if "part" in options:  # one collection as several sources of alike documents (ingest/parts.py)
        index, count = parse_part(options["part"])
        documents = (d for d in documents if part_of(d.doc_id, count) == index)
    # Records are chunked only when asked, since they usually are passages.
    words = options.get("chunk_words")
    if words:
        overlap = options.get("chunk_overlap", min(FILE_CHUNK_OVERLAP, words // 4))
        return list(chunk_documents(documents, words=words, overlap=overlap))
    return list(_chunk_long_records(documents, report))


def _chunk_long_records(documents, report: IngestReport):
    for document in documents:
        short = len(document.text) <= LONG_RECORD_WORDS * CHARS_PER_WORD  # a record without spaces is long too
        if short and len(document.text.split(maxsplit=LONG_RECORD_WORDS)) <= LONG_RECORD_WORDS:
            yield document
            continue
        report.chunked_long_records.append(document.doc_id)
        yield from chunk_documents([document], words=FILE_CHUNK_WORDS, overlap=FILE_CHUNK_OVERLAP)


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
                 wait: bool = False, ray_address: str = "", options_seen: str | None = None) -> BuildReport:
    """Build `spec` and publish it as the source's current version, unless its inputs are unchanged. One build
    of a source at a time (`wait`: wait for another to finish instead of failing); `ray_address`: its passages
    embedded on that Ray cluster (embedding/ray_batches.py)."""
    with source_lock(workspace / "sources" / spec.name, spec.name, wait=wait):
        return _build(workspace, spec, encoder, progress, ray_address, options_seen)


def _build(workspace: Path, spec: SourceSpec, encoder: str, progress: bool, ray_address: str,
           options_seen: str | None) -> BuildReport:
    started = time.perf_counter()
    encoder = encoder_name(encoder)
    for shared in (workspace / "cache" / "parsed").glob("*.json"):  # before version 3, one folder for all sources
        shared.unlink(missing_ok=True)
    if spec.kind == "files":
        return sync_folder(workspace, spec, encoder, progress, ray_address, options_seen)
    if spec.kind == "run":
        corpus, queries = _run_inputs(spec)
    source_dir = workspace / "sources" / spec.name
    report = IngestReport()
    documents = read_documents(spec, report)
    notes = unmatched_readers_notes(report)
    if spec.options.get("readers_field") and not any(d.readers for d in documents):  # a misspelt field, likely
        notes.append(f"no record names readers in field {spec.options['readers_field']!r} (readers_field): every "
                     "document is open to every reader of the source")
    if not documents:
        raise no_documents(spec, report)
    extra = [Path(spec.path), queries] if spec.kind == "run" else []
    fingerprint = _fingerprint(spec, encoder, documents, extra)

    previous = current_version(source_dir)
    if previous is not None and read_manifest(previous).get("fingerprint") == fingerprint:
        return BuildReport(spec.name, "unchanged", len(documents), time.perf_counter() - started,
                           **report.details(), notes=notes)

    embedded_now, described = 0, ""
    with new_version(workspace, spec) as (building, stamp):
        count = write_documents(building / "docs.sqlite", documents)
        manifest = manifest_for(spec, documents=count, restricted=sum(1 for d in documents if d.readers),
                                fingerprint=fingerprint, stamp=stamp, report=report)
        if spec.kind == "run":
            manifest.update(write_run_tables(building, Path(spec.path), queries, report, spec.options.get("depth")))
            manifest["corpus"] = str(corpus.resolve())
        else:
            notes += encoder_change_notes(previous, encoder)
            vectors, embedded_now, described, encoder_notes = embed_passages(workspace, encoder, documents, progress,
                                                                             ray_address)
            notes += encoder_notes
            write_embedded_index(building, documents, vectors)
            manifest["encoder"] = encoder
        write_manifest(building, manifest)
    return BuildReport(spec.name, "built", count, time.perf_counter() - started, embedded_now, **report.details(),
                       encoder=described, notes=notes)
