"""A folder source kept current file by file: a sync reads, parses and embeds only the files that changed.

Each version's document store keeps its files as the sync saw them (size, modification and change times, inode,
the hash of the bytes; docstore.FileRecord). The next sync lists the folder and compares: a file whose stat is
the same is not opened; one whose stat moved is hashed, and parsed only where its bytes changed (a `touch` costs a
read). The new version is the previous one changed in place of a copy: the passages of changed, renamed and
deleted files are dropped (their rows become holes), new ones appended, the BM25 segments linked rather than
rewritten (sources/embedded.py). When holes pass half the rows, the next change writes the source whole again.

Like every build it happens in a build folder that is published atomically, under the source's lock: a sync that
is killed leaves the previous version current and its build folder is removed by the next one, which redoes the
work from the files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path

from gradfuse.indexing.file_readers import FileReaders, readers_by_file
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
from gradfuse.ingest.files import FileRead, FileReader, ListedFile, list_files, prune_parse_cache
from gradfuse.ingest.readers import LIMIT_OPTIONS, ReaderLimits
from gradfuse.sources.base import FORMAT_VERSION, SourceSpec, current_version, read_manifest, write_manifest
from gradfuse.sources.docstore import FileRecord, read_files_table, update_documents, write_documents
from gradfuse.sources.embedded import live_holes, update_embedded_index, write_embedded_index

FILE_CHUNK_WORDS, FILE_CHUNK_OVERLAP = 200, 40
# A file whose modification time is this close to a listing may be written again without its stat moving (a
# write within the clock's resolution): it is hashed again by the next sync, as git does with "racy" entries.
RACY_NS = 2_000_000_000
COMPACT_AT = 0.5  # holes over this share of the rows: the next change writes the source whole
REFUSED = "refused"  # the readers recorded for a hard link across readers (FileReaders.refused)


def file_options(options: dict) -> dict:
    """How a files source's options read its files (ingest/files.py): files are always chunked (a file can be a
    book), inside each page, section, slide or sheet."""
    words = options.get("chunk_words", FILE_CHUNK_WORDS)
    return {"words": words, "overlap": options.get("chunk_overlap", min(FILE_CHUNK_OVERLAP, words // 4)),
            "limits": ReaderLimits(**{k: options[k] for k in LIMIT_OPTIONS if k in options}),
            "links_outside": bool(options.get("links_outside", False))}


@dataclasses.dataclass
class _Changes:
    kept: dict[str, FileRecord]  # files as they were (a moved stat with the same bytes: with its new stat)
    restamped: list[FileRecord]  # kept files whose stat moved
    read: dict[str, tuple[FileRecord, FileRead]]  # files new or changed, read again
    gone: list[str]  # files of the previous version no longer listed
    replaced: list[str]  # files of the previous version read again

    def counts(self, listed: int) -> dict[str, int]:
        return {"listed": listed, "read": len(self.read), "added": len(self.read) - len(self.replaced),
                "changed": len(self.replaced), "deleted": len(self.gone), "unchanged": len(self.kept)}

    @property
    def dropped(self) -> list[str]:
        """The previous version's files whose passages go."""
        return self.gone + self.replaced


def sync_folder(workspace: Path, spec: SourceSpec, encoder: str, progress: bool) -> BuildReport:
    """Bring the source's published version in line with its folder, reading only what changed (called with
    the source's lock held)."""
    started = time.perf_counter()
    folder, source_dir = Path(spec.path), workspace / "sources" / spec.name
    previous = current_version(source_dir)
    setting = _setting(spec, encoder)
    base = previous if previous is not None and _extendable(previous, setting) else None
    before = read_manifest(base) if base is not None else {}
    known = read_files_table(base / "docs.sqlite") if base is not None else {}
    report = IngestReport()
    listed_at = time.time_ns()
    listed = list_files(folder, report)
    readers = readers_by_file(spec.options.get("readers", {}), folder, [f.relative for f in listed])
    report.unmatched_readers.extend(readers.unmatched)
    notes = unmatched_readers_notes(report)
    racy_before = before.get("listed_at_ns", RACY_NS) - RACY_NS
    cache = workspace / "cache" / "parsed" / spec.name
    with FileReader(folder, **file_options(spec.options), cache=cache) as reader:
        changes = _compare(listed, known, readers, reader, racy_before)
    for record in changes.kept.values():
        report.merge(IngestReport.from_json(record.report))
    for _, read in changes.read.values():
        report.merge(read.report)

    if base is not None and not changes.read and not changes.gone:
        return BuildReport(spec.name, "unchanged", before["documents"], time.perf_counter() - started,
                           **report.details(), notes=notes, files=changes.counts(len(listed)))
    added = [dataclasses.replace(d, readers=readers.of[path]) if readers.of[path] else d
             for path, (_, read) in changes.read.items() for d in read.documents]
    records = {**changes.kept, **{path: record for path, (record, _) in changes.read.items()}}
    embedded_now, described = 0, ""
    with new_version(workspace, spec) as (building, stamp):
        vectors, embedded_now, described, encoder_notes = embed_passages(workspace, encoder, added, progress)
        notes += encoder_change_notes(previous, encoder) + encoder_notes
        if base is None:
            count = write_documents(building / "docs.sqlite", added, records.values())
            write_embedded_index(building, added, vectors)
            rows, restricted = count, sum(bool(d.readers) for d in added)
        else:
            shutil.copyfile(base / "docs.sqlite", building / "docs.sqlite")
            new_records = [record for record, _ in changes.read.values()] + changes.restamped
            dropped_rows, count, restricted = update_documents(
                building / "docs.sqlite", dropped_files=changes.dropped, documents=added, first_row=before["rows"],
                files=new_records)
            update_embedded_index(base, building, dropped_files=changes.dropped, dropped_rows=dropped_rows,
                                  documents=added, vectors=vectors)
            rows = before["rows"] + len(added)
        if not count:
            raise no_documents(spec, report)
        manifest = manifest_for(spec, documents=count, restricted=restricted,
                                fingerprint=_fingerprint(setting, records), stamp=stamp, report=report)
        manifest.update(encoder=encoder, setting=setting, listed_at_ns=listed_at, rows=rows,
                        files=changes.counts(len(listed)))
        write_manifest(building, manifest)
    prune_parse_cache(cache, {record.parse_entry for record in records.values()})
    return BuildReport(spec.name, "built", count, time.perf_counter() - started, embedded_now, **report.details(),
                       encoder=described, notes=notes, files=changes.counts(len(listed)))


def _compare(listed: list[ListedFile], known: dict[str, FileRecord], readers: FileReaders, reader: FileReader,
             racy_before: int) -> _Changes:
    changes = _Changes({}, [], {}, [], [])
    for file in listed:
        path = file.relative
        given = REFUSED if path in readers.refused else json.dumps(readers.of[path])
        old = known.get(path)
        same_readers = old is not None and old.readers == given
        if same_readers and old.stamp == file.stamp and file.mtime_ns < racy_before:
            changes.kept[path] = old
            continue
        if given == REFUSED:
            read = FileRead([], IngestReport(skipped_unreadable=[readers.refusal(path)]))
        else:
            read = reader.read(path, known_digest=old.digest if same_readers else None)
        if read.unchanged:
            changes.kept[path] = dataclasses.replace(old, stamp=file.stamp)
            changes.restamped.append(changes.kept[path])
            continue
        record = FileRecord(path, file.stamp, read.digest, given, read.parse_entry, read.report.to_json())
        changes.read[path] = (record, read)
    listed_paths = {file.relative for file in listed}
    changes.gone = [path for path in known if path not in listed_paths]
    changes.replaced = [path for path in changes.read if path in known]
    return changes


def _setting(spec: SourceSpec, encoder: str) -> str:
    """What every file's passages depend on besides the file: when it differs, nothing is reused."""
    return hashlib.sha256(json.dumps([FORMAT_VERSION, spec.kind, spec.options, encoder],
                                     sort_keys=True).encode()).hexdigest()


def _extendable(version: Path, setting: str) -> bool:
    """Whether a sync may change `version` rather than write the source whole: made by a sync with the same
    setting, and holes under COMPACT_AT of its rows."""
    manifest = read_manifest(version)
    if manifest.get("setting") != setting or "rows" not in manifest:
        return False
    return len(live_holes(version)) <= COMPACT_AT * max(1, manifest["rows"])


def _fingerprint(setting: str, records: dict[str, FileRecord]) -> str:
    digest = hashlib.sha256(setting.encode())
    for path in sorted(records):
        digest.update(json.dumps([path, records[path].digest, records[path].readers]).encode())
    return digest.hexdigest()

