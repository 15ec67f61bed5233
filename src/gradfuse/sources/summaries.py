"""Every source's summary (sources/summary.py), held in memory and stacked for routing (selection/routing.py).

- A built source's is read from its published version, again whenever it publishes another (its pointer's
  modification time is checked whenever the catalog lists its sources again, which a publish makes it do).
- An engine's, a database table's or a remote gradfuse's is made from a sample read through its own client (a
  remote sends its own), kept under `cache/summaries/`, and made again once older than `[routing] refresh_s`.
  It is made on a background thread: until it exists the source is asked every time (it cannot be judged), so no
  question ever waits for a summary. `make` makes them now (`gradfuse summarize`).
- A source that cannot be sampled (a TREC run, a retriever added in code) has none and is always asked.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from gradfuse.sources.base import current_version
from gradfuse.sources.encoder import load_encoder
from gradfuse.sources.summary import SAMPLE_TEXTS, SourceSummary, SummaryTable, read_summary, summarize

RETRY_S = 60.0  # a summary that could not be made is tried again after this long


class Summaries:
    def __init__(self, catalog):
        """`catalog` (sources/catalog.py) gives the root, the settings (read at each use: they may be replaced),
        `holding(name)`, which opens a source, and `summary_fingerprint(name)`: what its summary depends on beyond
        its data (an engine's settings), or None for a source built here."""
        self._catalog = catalog
        self.root = catalog.root
        self._built: dict[str, tuple[int, SourceSummary | None]] = {}  # name → (pointer mtime, summary)
        self._made: dict[str, tuple[str, float, SourceSummary | None, str]] = {}  # name → (key, when, summary, why)
        self._stacked: tuple[tuple, SummaryTable] | None = None
        self._generation = 0  # counts every summary read or made: the stacked table is made again when it moves
        # What is known to be current until the catalog lists its sources again (see `_fingerprint`)
        self._era: tuple | None = None
        self._fingerprints: dict[str, str | None] = {}
        self._checked: set[str] = set()
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    def close(self) -> None:
        if self._worker is not None:
            self._queue.put(None)

    def table(self, names: Iterable[str]) -> tuple[SummaryTable, dict[str, str], list[str]]:
        """The summaries of `names` stacked; the names without one (asked always), each with why; and the empty
        ones (never asked)."""
        summaries, unscored, empty = {}, {}, []
        generation = self._generation  # before reading: a change meanwhile makes the next call stack again
        for name in names:
            summary, why = self.get(name)
            if summary is None:
                unscored[name] = why
            elif summary.documents and len(summary.centroids):
                summaries[name] = summary
            else:
                empty.append(name)
        with self._lock:
            key = (tuple(summaries), generation)
            if self._stacked is None or self._stacked[0] != key:
                self._stacked = (key, SummaryTable.stack(summaries))
            return self._stacked[1], unscored, empty

    def get(self, name: str) -> tuple[SourceSummary | None, str]:
        """A source's summary, or None and why it has none."""
        fingerprint = self._fingerprint(name)
        return self._built_summary(name) if fingerprint is None else self._made_summary(name, fingerprint)

    def _fingerprint(self, name: str) -> str | None:
        """The catalog's summary fingerprint, read again when the sources were listed again or the settings
        replaced (it looks for a database registration on disk: 1,000 file checks a question otherwise)."""
        era = (self._catalog.listings, id(self._catalog.config))
        with self._lock:
            if self._era != era:
                self._era, self._fingerprints, self._checked = era, {}, set()
            fingerprints = self._fingerprints
        if name not in fingerprints:
            fingerprints[name] = self._catalog.summary_fingerprint(name)
        return fingerprints[name]

    @property
    def encoder(self) -> str:
        return self._catalog.config.encoder

    def _built_summary(self, name: str) -> tuple[SourceSummary | None, str]:
        known = self._built.get(name)
        if known is not None and name in self._checked:  # unchanged since the sources were last listed
            return known[1], self._built_reason
        source_dir = self.root / "sources" / name
        try:
            stamp = os.stat(source_dir / "CURRENT").st_mtime_ns
        except FileNotFoundError:
            return None, "no summary: not built here"
        self._checked.add(name)
        if known is None or known[0] != stamp:
            version = current_version(source_dir)
            known = self._built[name] = (stamp, read_summary(version) if version else None)
            with self._lock:
                self._generation += 1
        return known[1], self._built_reason

    _built_reason = "no summary: a TREC run source answers only its own queries"

    def _made_summary(self, name: str, fingerprint: str) -> tuple[SourceSummary | None, str]:
        key = _key(fingerprint, self.encoder)
        with self._lock:
            made = self._made.get(name)
        if made is None or made[0] != key:
            made = self._from_disk(name, key)
        refresh_s = self._catalog.config.routing.refresh_s
        if made is None or time.time() - made[1] > (refresh_s if made[2] is not None else RETRY_S):
            self._schedule(name)
        if made is None:
            return None, "no summary yet: being made from a sample of it (asked until then)"
        return made[2], made[3]

    def _from_disk(self, name: str, key: str):
        path = self._path(name, key)
        if not path.is_file():
            return None
        made = (key, path.stat().st_mtime, SourceSummary.load(path), "")
        with self._lock:
            self._made[name] = made
            self._generation += 1
        return made

    def _path(self, name: str, key: str) -> Path:
        return self.root / "cache" / "summaries" / f"{name}-{key}.npz"

    def _schedule(self, name: str) -> None:
        with self._lock:
            if name in self._pending:
                return
            self._pending.add(name)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="gradfuse-summaries", daemon=True)
                self._worker.start()
        self._queue.put(name)

    def _work(self) -> None:
        while (name := self._queue.get()) is not None:
            try:
                self.make([name])
            finally:
                with self._lock:
                    self._pending.discard(name)

    def make(self, names: Iterable[str]) -> dict[str, str]:
        """Make the summaries of `names` that are made from a sample (engines, tables, remotes) now; what each
        came to ("" for made, else why not)."""
        outcome = {}
        for name in names:
            fingerprint = self._catalog.summary_fingerprint(name)
            if fingerprint is None:
                continue
            key = _key(fingerprint, self.encoder)
            try:
                summary, why = self._sampled(name), ""
            except Exception as error:  # any failure of the source: it stays unjudged, hence always asked
                summary, why = None, f"no summary: sampling it failed ({type(error).__name__}: {str(error)[:200]})"
            if summary is None and not why:
                why = "no summary: this kind of source cannot be sampled (it is always asked)"
            if summary is not None:
                path = self._path(name, key)
                path.parent.mkdir(parents=True, exist_ok=True)
                for old in path.parent.glob(f"{name}-*.npz"):
                    old.unlink(missing_ok=True)
                summary.save(path)
            with self._lock:
                self._made[name] = (key, time.time(), summary, why)
                self._generation += 1
            outcome[name] = why
        return outcome

    def _sampled(self, name: str) -> SourceSummary | None:
        with self._catalog.holding(name) as source:
            if hasattr(source, "summary"):  # another gradfuse: it sends its own
                return source.summary(self.encoder)
            if not hasattr(source, "sample_texts"):
                return None
            documents, texts = source.sample_texts(SAMPLE_TEXTS)
        return summarize(load_encoder(self.encoder).encode(texts), documents=documents)


def _key(fingerprint: str, encoder: str) -> str:
    return hashlib.sha256(f"{fingerprint}\n{encoder}".encode()).hexdigest()[:16]
