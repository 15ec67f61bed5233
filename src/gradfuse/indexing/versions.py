"""What every build shares: the build folder that becomes a published version (or is removed), the manifest it
writes, how its passages are embedded, and the notes and errors a build reports."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from gradfuse.embedding.encoder import EmbeddingCache, embedding_text, load_encoder
from gradfuse.embedding.encoder_names import recorded_encoder
from gradfuse.folders import private_folder
from gradfuse.ingest.documents import Document, IngestError, IngestReport
from gradfuse.sources.base import FORMAT_VERSION, SourceSpec, publish_version, read_manifest


@contextmanager
def new_version(workspace: Path, spec: SourceSpec) -> Iterator[tuple[Path, datetime]]:
    """(a build folder, when it was started): published as the source's current version when the block ends,
    removed when it fails (the published version is unchanged). Called with the source's lock held."""
    source_dir = workspace / "sources" / spec.name
    private_folder(source_dir, up_to=workspace)
    for stale in source_dir.glob("build-*"):  # left by a build that was killed: this one holds the lock now
        shutil.rmtree(stale, ignore_errors=True)
    stamp = datetime.now(timezone.utc)
    building = source_dir / f"build-{stamp:%Y%m%dT%H%M%S%f}-{os.getpid()}"
    building.mkdir()
    try:
        yield building, stamp
        version = building.with_name("v-" + building.name.removeprefix("build-"))
        building.rename(version)
        publish_version(source_dir, version)
    except BaseException as error:
        shutil.rmtree(building, ignore_errors=True)
        if _disk_full(error):
            raise IngestError(f"source {spec.name!r}: the disk is full (building in {source_dir}): free some "
                              "space and index again; the published version is unchanged") from None
        raise


def manifest_for(spec: SourceSpec, *, documents: int, restricted: int, fingerprint: str, stamp: datetime,
                 report: IngestReport) -> dict:
    return {
        "name": spec.name,
        "kind": spec.kind,
        "input": str(Path(spec.path).resolve()),
        "options": spec.options,
        "documents": documents,
        "restricted": restricted,  # documents that name their readers
        "fingerprint": fingerprint,
        "built_at": stamp.isoformat(timespec="seconds"),
        "format_version": FORMAT_VERSION,
        "ingest": report.summary(),
        "encoder": None,
    }


def embed_passages(workspace: Path, encoder: str, documents: list[Document], progress: bool,
                   ray_address: str = "") -> tuple[np.ndarray, int, str, list[str]]:
    """(the passages' vectors, how many were computed now rather than found in the workspace's cache, the encoder
    as described to the user, its note); `ray_address`: the missing ones embedded on that Ray cluster."""
    if not documents:  # a sync that only drops files: no encoder to load
        return np.zeros((0, 0), dtype=np.float32), 0, "", []
    model = load_encoder(encoder)
    cache = EmbeddingCache(workspace / "cache" / "embeddings.sqlite", model)
    texts = [embedding_text(d.title, d.text) for d in documents]
    try:
        if not ray_address:
            vectors = cache.embed(texts, progress=progress)
            return vectors, cache.last_computed, model.describe(), list(filter(None, [model.note]))
        from gradfuse.embedding.ray_batches import RayBatches

        with RayBatches(ray_address, encoder) as batches:
            vectors = cache.embed(texts, progress=progress, batches=batches)
        return vectors, cache.last_computed, f"{model.name} ({batches.where})", []
    finally:
        cache.close()


def encoder_change_notes(previous: Path | None, encoder: str) -> list[str]:
    before = read_manifest(previous).get("encoder") if previous is not None else None
    if before and recorded_encoder(before) != encoder:
        return [f"its encoder changed from {recorded_encoder(before)} to {encoder}: every passage is embedded again"]
    return []


def unmatched_readers_notes(report: IngestReport) -> list[str]:
    return [f"readers pattern {pattern!r} matches no file: the files it was meant for are open to every reader "
            "of the source" for pattern in report.unmatched_readers]


def no_documents(spec: SourceSpec, report: IngestReport) -> IngestError:
    skipped = "".join(f"\n  {name}: {reason} ({detail})" for name, reason, detail in report.skipped_unreadable)
    return IngestError(f"source {spec.name!r}: {spec.path} holds no documents"
                       + (f"; files skipped:{skipped}" if skipped else ""))


def _disk_full(error: BaseException) -> bool:
    said = str(error)
    return ((isinstance(error, OSError) and error.errno == errno.ENOSPC)
            or (isinstance(error, sqlite3.OperationalError) and "disk is full" in said)
            # numpy's short write of a matrix ("N requested and M written", no errno) and tantivy's I/O errors
            or (isinstance(error, (OSError, ValueError)) and ("requested and" in said and "written" in said
                                                               or "No space left on device" in said)))
