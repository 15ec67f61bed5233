"""A folder source kept current file by file: a sync reads, parses and embeds only the files that changed.

Each version's document store keeps its files (the hash of each one's bytes, its readers, what reading it
reported: docstore.FileRecord), and beside the versions file_stamps.py keeps what the last sync saw of each (size,
modification and change times, inode). The next sync lists the folder and compares: a file whose stat has not
moved is not opened; one whose stat moved is hashed, and parsed only where its bytes changed (a `touch` costs a
read). The new version is a copy of the previous one, changed: the passages of changed, renamed and deleted files
are dropped (their rows become holes), new ones appended, the BM25 segments linked rather than rewritten
(sources/embedded.py). When holes pass half the rows, the next change writes the source whole again. docs/folders.md
has what it costs.

Like every build it happens in a build folder that is published atomically, under the source's lock: a sync that
is killed leaves the previous version current and its build folder is removed by the next one, which redoes the
work from the files.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
import time
from pathlib import Path

from gradfuse.embedding.encoder_names import recorded_encoder
from gradfuse.folders import private_folder
from gradfuse.indexing.file_readers import FileReaders, readers_by_file
from gradfuse.indexing.file_stamps import FileStamps
from gradfuse.indexing.report import BuildReport
from gradfuse.indexing.versions import (
    embed_passages,
    encoder_change_notes,
    manifest_for,
    new_version,
    no_documents,
    unmatched_readers_notes,
)
from gradfuse.ingest.documents import IngestReport
from gradfuse.ingest.files import PARSE_VERSION, FileRead, FileReader, ListedFile, list_files, prune_parse_cache
from gradfuse.ingest.readers import LIMIT_OPTIONS, ReaderLimits
from gradfuse.sources.base import (
    FORMAT_VERSION,
    SourceError,
    SourceSpec,
    current_version,
    read_manifest,
    write_manifest,
)
from gradfuse.sources.docstore import FileRecord, read_files_table, update_documents, write_documents
from gradfuse.sources.embedded import live_holes, update_embedded_index, write_embedded_index

FILE_CHUNK_WORDS, FILE_CHUNK_OVERLAP = 200, 40
STAMPS_FILE = "files.sqlite"  # beside the versions (indexing/file_stamps.py)
COMPACT_AT = 0.5  # holes over this share of the rows: the next change writes the source whole
REFUSED = "refused"  # the readers recorded for a hard link across readers (FileReaders.refused)
UNREAD = "unread:"  # the digest of a file skipped before its bytes were read: its stat stands for them


def file_options(options: dict) -> dict:
    """How a files source's options read its files (ingest/files.py): files are always chunked (a file can be a
    book), inside each page, section, slide or sheet."""
    words = options.get("chunk_words", FILE_CHUNK_WORDS)
    return {"words": words, "overlap": options.get("chunk_overlap", min(FILE_CHUNK_OVERLAP, words // 4)),
            "limits": ReaderLimits(**{k: options[k] for k in LIMIT_OPTIONS if k in options}),
            "links_outside": bool(options.get("links_outside", False))}


def listing_options(options: dict) -> dict:
    """Which files of the folder a files source lists (ingest/files.py: list_files)."""
    return {"hidden": bool(options.get("hidden", False)), "gitignore": bool(options.get("gitignore", True))}


@dataclasses.dataclass
class _Changes:
    kept: dict[str, FileRecord]  # files as they were
    read: dict[str, tuple[FileRecord, FileRead]]  # files new or changed, read again
    gone: list[str]  # files of the previous version no longer listed
    replaced: list[str]  # files of the previous version read again
    hashed: int = 0  # files opened for their hash alone: their stat moved, their bytes did not

    def counts(self, listed: int) -> dict[str, int]:
        return {"listed": listed, "hashed": self.hashed, "read": len(self.read),
                "added": len(self.read) - len(self.replaced),
                "changed": len(self.replaced), "deleted": len(self.gone), "unchanged": len(self.kept)}

    @property
    def records(self) -> dict[str, FileRecord]:
        """Every file of the new version."""
        return {**self.kept, **{path: record for path, (record, _) in self.read.items()}}

    @property
    def dropped(self) -> list[str]:
        """The previous version's files whose passages go."""
        return self.gone + self.replaced


@dataclasses.dataclass(frozen=True)
class _Written:
    count: int  # passages held
    rows: int  # rows of the matrix, holes included
    restricted: int  # passages that name their readers
    embedded_now: int
    encoder: str  # as described to the user
    notes: list[str]


def sync_folder(workspace: Path, spec: SourceSpec, encoder: str, progress: bool, ray_address: str = "",
                options_seen: str | None = None) -> BuildReport:
    """Bring the source's published version in line with its folder, reading only what changed (called with
    the source's lock held). `options_seen`: the folder and options of the version published when `spec` was read
    (`published_with`, "" for none): where another build has since published other ones than both those and
    `spec`'s, nothing is written (a watcher's sync or a `gradfuse build` read them before that build)."""
    started = time.perf_counter()
    folder, source_dir = Path(spec.path), workspace / "sources" / spec.name
    previous = current_version(source_dir)
    if options_seen is not None and previous is not None:
        now = published_with(read_manifest(previous))
        if now != options_seen and now != built_with(spec, encoder):
            raise SourceError(f"source {spec.name!r} was published with other options by another build after "
                              "this one read them: not built (run it again to apply its own)")
    setting = _setting(spec, encoder)
    base = previous if previous is not None and _extendable(previous, setting) else None
    known = read_files_table(base / "docs.sqlite") if base is not None else {}
    report = IngestReport()
    listed_at = time.time_ns()
    listed = list_files(folder, report, **listing_options(spec.options))
    readers = readers_by_file(spec.options.get("readers", {}), folder, [f.relative for f in listed])
    report.unmatched_readers.extend(readers.unmatched)
    notes = unmatched_readers_notes(report)
    cache = workspace / "cache" / "parsed" / spec.name
    private_folder(source_dir, up_to=workspace)
    stamps = FileStamps(source_dir / STAMPS_FILE)
    try:
        with FileReader(folder, **file_options(spec.options), cache=cache) as reader:
            changes = _compare(listed, known, readers, reader, stamps, listed_at)
        for record in changes.kept.values():
            report.merge(IngestReport.from_json(record.report))
        for _, read in changes.read.values():
            report.merge(read.report)
        counts = changes.counts(len(listed))
        if base is not None and not changes.read and not changes.gone:
            stamps.save({file.relative for file in listed})
            return BuildReport(spec.name, "unchanged", read_manifest(base)["documents"],
                               time.perf_counter() - started, **report.details(), notes=notes, files=counts)
        with new_version(workspace, spec) as (building, stamp):
            embed = functools.partial(embed_passages, workspace, encoder, progress=progress, ray_address=ray_address)
            written = _write(spec, building, base, changes, readers, report, embed, first=previous is None)
            notes += encoder_change_notes(previous, encoder) + written.notes
            manifest = manifest_for(spec, documents=written.count, restricted=written.restricted,
                                    fingerprint=_fingerprint(setting, changes.records), stamp=stamp, report=report)
            write_manifest(building, {**manifest, "encoder": encoder, "setting": setting, "rows": written.rows,
                                      "files": counts})
        stamps.save({file.relative for file in listed})
    finally:
        stamps.close()
    prune_parse_cache(cache, {record.parse_entry for record in changes.records.values()})
    return BuildReport(spec.name, "built", written.count, time.perf_counter() - started, written.embedded_now,
                       **report.details(), encoder=written.encoder, notes=notes, files=counts)


def built_with(spec: SourceSpec, encoder: str) -> str:
    """A folder source's folder, options and encoder, as compared with a published version's (`published_with`)."""
    return json.dumps([str(Path(spec.path).resolve()), spec.options, encoder], sort_keys=True)


def options_published(source_dir: Path) -> str:
    """`published_with` of the source's current version, "" where none is published."""
    version = current_version(source_dir)
    return published_with(read_manifest(version)) if version is not None else ""


def published_with(manifest: dict) -> str:
    """A published version's folder, options and encoder (from its manifest), as `built_with` spells them."""
    encoder = manifest.get("encoder")
    return json.dumps([manifest.get("input"), manifest.get("options", {}), encoder and recorded_encoder(encoder)],
                      sort_keys=True)


def _write(spec: SourceSpec, building: Path, base: Path | None, changes: _Changes, readers: FileReaders,
           report: IngestReport, embed, *, first: bool) -> _Written:
    """The new version's store in `building`: from scratch, or `base` changed; `embed`: the passages' vectors
    (versions.embed_passages, with the build's encoder and where it embeds). A folder emptied (or whose every
    file is now skipped) publishes an empty source, so that nothing it held is served; only a `first` build of
    nothing is an error."""
    added = [readers.given(d) for _, read in changes.read.values() for d in read.documents]
    vectors, embedded_now, described, notes = embed(added)
    new_records = [record for record, _ in changes.read.values()]
    if base is None:
        count = write_documents(building / "docs.sqlite", added, new_records)
        write_embedded_index(building, added, vectors)
        rows, restricted = count, sum(bool(d.readers) for d in added)
    else:
        shutil.copyfile(base / "docs.sqlite", building / "docs.sqlite")
        first_row = read_manifest(base)["rows"]
        dropped_rows, count, restricted = update_documents(building / "docs.sqlite", dropped_files=changes.dropped,
                                                           documents=added, first_row=first_row, files=new_records)
        update_embedded_index(base, building, dropped_files=changes.dropped, dropped_rows=dropped_rows,
                              documents=added, vectors=vectors)
        rows = first_row + len(added)
    if not count and first:
        raise no_documents(spec, report)
    return _Written(count, rows, restricted, embedded_now, described, notes)


def _compare(listed: list[ListedFile], known: dict[str, FileRecord], readers: FileReaders, reader: FileReader,
             stamps: FileStamps, listed_at: int) -> _Changes:
    changes = _Changes({}, {}, [], [])
    for file in listed:
        path = file.relative
        given = REFUSED if path in readers.refused else json.dumps(readers.of[path])
        old = known.get(path)
        same_readers = old is not None and old.readers == given
        if same_readers and stamps.digest(file) == old.digest:  # its stat has not moved: not opened
            changes.kept[path] = old
            continue
        if given == REFUSED:
            read = FileRead([], IngestReport(skipped_unreadable=[readers.refusal(path)]))
        else:
            read = reader.read(path, known_digest=old.digest if same_readers else None, inode=file.inode)
        digest = read.digest or f"{UNREAD}{file.stamp}"
        if not read.retry:
            stamps.record(file, digest, listed_at)
        if read.unchanged or (same_readers and digest == old.digest):
            changes.kept[path] = old
            changes.hashed += 1
            continue
        record = FileRecord(path, digest, given, read.parse_entry, read.report.to_json())
        changes.read[path] = (record, read)
    listed_paths = {file.relative for file in listed}
    changes.gone = [path for path in known if path not in listed_paths]
    changes.replaced = [path for path in changes.read if path in known]
    return changes


def _setting(spec: SourceSpec, encoder: str) -> str:
    """What every file's passages depend on besides the file (the folder, the options, the encoder, the index's
    format and the readers' output): when it differs, nothing is reused."""
    return hashlib.sha256(json.dumps([FORMAT_VERSION, PARSE_VERSION, spec.kind, str(Path(spec.path).resolve()),
                                      spec.options, encoder], sort_keys=True).encode()).hexdigest()


def _extendable(version: Path, setting: str) -> bool:
    """Whether a sync may change `version` rather than write the source whole: made by a sync with the same
    setting, and holes under COMPACT_AT of its rows."""
    manifest = read_manifest(version)
    if manifest.get("setting") != setting or not manifest.get("rows"):  # an empty one has no matrix to extend
        return False
    return len(live_holes(version)) <= COMPACT_AT * max(1, manifest["rows"])


def _fingerprint(setting: str, records: dict[str, FileRecord]) -> str:
    digest = hashlib.sha256(setting.encode())
    for path in sorted(records):
        digest.update(json.dumps([path, records[path].digest, records[path].readers]).encode())
    return digest.hexdigest()

