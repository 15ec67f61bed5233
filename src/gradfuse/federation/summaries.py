"""Every source's summary (sources/summary.py), held in memory and stacked for routing (selection/routing.py).

- A built source's is read from its published version, again whenever it publishes another (its pointer's
  modification time is checked whenever the catalog lists its sources again, which a publish makes it do). An
  index built before summaries existed has one made from its vectors when first needed, kept in memory.
- An engine's, a database table's or a remote gradfuse's is made from a sample read through its own client (a
  remote sends its own), kept under `cache/summaries/`, and made again when the source changed: every
  `[routing] check_s` its change marker is read (a count, a version, PostgreSQL's row statistics, a remote's build
  times: `change_marker()` on the source), and a summary whose marker moved is made again; once older than
  `[routing] refresh_s` it is made again anyway (what a marker cannot see: a count left equal by an update).
  It is made on a background thread: until it exists the source is asked every time (it cannot be judged), so no
  question waits for a sample. One that could not be made is tried again after 1, 2, 4 ... minutes (at most
  `refresh_s`); a kind of source that cannot be sampled (a retriever added in code) is not tried again. `make`
  makes them now (`gradfuse summarize`).
- A summary that cannot be read, or is in another encoder's space, leaves its source unjudged (asked), with why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gradfuse.sources.base import current_version
from gradfuse.embedding.encoder import load_encoder
from gradfuse.sources.summary import SAMPLE_TEXTS, SourceSummary, SummaryTable, read_summary, summarize

RETRY_S = 60.0  # a summary that could not be made is tried again after this long, doubling each failure
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Made:
    key: str  # what it was made for (the source's settings and the encoder)
    when: float
    summary: SourceSummary | None
    why: str  # where there is none
    failures: int = 0  # in a row
    final: bool = False  # this kind of source cannot be sampled: not tried again
    marker: str | None = None  # the source's change marker when it was sampled (None: it has none)
    checked: float = 0.0  # when the marker was last read (monotonic)


class Summaries:
    def __init__(self, catalog):
        """`catalog` (federation/catalog.py) gives the root, the settings (read at each use: they may be replaced),
        `holding(name)`, which opens a source, and `summary_fingerprint(name)`: what its summary depends on beyond
        its data (an engine's settings), or None for a source built here."""
        self._catalog = catalog
        self.root = catalog.root
        self._built: dict[str, tuple[int, SourceSummary | None, str]] = {}  # name → (pointer mtime, summary, why)
        self._made: dict[str, _Made] = {}
        self._stacked: tuple[tuple, SummaryTable] | None = None
        self._tabled: tuple | None = None  # the last table's question, answer and sampled names
        self._generation = 0  # counts every summary read or made: the stacked table is made again when it moves
        # What is known to be current until the catalog lists its sources again (see `_fingerprint`)
        self._era: tuple | None = None
        self._fingerprints: dict[str, str | None] = {}
        self._checked: set[str] = set()
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._closed = False

    def close(self) -> None:
        """Stop making summaries (one being made finishes its source first: `make` waits for nothing)."""
        self._closed = True
        if self._worker is not None:
            self._queue.put(None)

    def table(self, names: Iterable[str], dimension: int) -> tuple[SummaryTable, dict[str, str], list[str]]:
        """The summaries of `names` stacked; the names without one in this `dimension` (asked always), each with
        why; and the empty ones (never asked)."""
        names = tuple(names)
        key = (names, dimension, self._catalog.listings, id(self._catalog.config), self._generation)
        kept = self._tabled
        if kept is not None and kept[0] == key:  # nothing changed: only the sampled ones may be due again
            for name in kept[2]:
                self.get(name)
            return kept[1]
        summaries, unscored, empty = {}, {}, []
        generation = self._generation  # before reading: a change meanwhile makes the next call stack again
        for name in names:
            summary, why = self.get(name)
            if summary is not None and summary.documents and summary.centroids.shape[1] != dimension:
                summary, why = None, (f"no summary in this encoder's space (dimension {summary.centroids.shape[1]}, "
                                      f"not {dimension})")
            if summary is None:
                unscored[name] = why
            elif summary.documents and len(summary.centroids):
                summaries[name] = summary
            else:
                empty.append(name)
        with self._lock:
            stacked_key = (tuple(summaries), generation)
            if self._stacked is None or self._stacked[0] != stacked_key:
                self._stacked = (stacked_key, SummaryTable.stack(summaries))
            result = self._stacked[1], unscored, empty
        sampled = [n for n in names if self._fingerprints.get(n) is not None]
        self._tabled = (key[:-1] + (generation,), result, sampled)
        return result

    def get(self, name: str) -> tuple[SourceSummary | None, str]:
        """A source's summary, or None and why it has none (one source's fault never fails the others)."""
        try:
            fingerprint = self._fingerprint(name)
            return self._built_summary(name) if fingerprint is None else self._made_summary(name, fingerprint)
        except Exception as error:  # a summary is a hint: its source is then asked, unjudged
            return None, f"no summary: it could not be read ({type(error).__name__}: {str(error)[:200]})"

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
            return known[1], known[2]
        source_dir = self.root / "sources" / name
        try:
            stamp = os.stat(source_dir / "CURRENT").st_mtime_ns
        except FileNotFoundError:
            return None, "no summary: not built here"
        self._checked.add(name)
        if known is None or known[0] != stamp:
            version = current_version(source_dir)
            try:
                summary = read_summary(version) if version else None
                why = "" if summary else "no summary: its index holds no passage vectors (a TREC run source)"
            except Exception as error:  # read once a version: a broken file is not read again at each question
                summary, why = None, f"no summary: it could not be read ({type(error).__name__}: {str(error)[:200]})"
            known = self._built[name] = (stamp, summary, why)
            with self._lock:
                self._generation += 1
        return known[1], known[2]

    def _made_summary(self, name: str, fingerprint: str) -> tuple[SourceSummary | None, str]:
        key = _key(fingerprint, self.encoder)
        with self._lock:
            made = self._made.get(name)
        if made is None or made.key != key:
            made = self._from_disk(name, key)
        if made is None or self._due(made):
            self._schedule(name)
        elif made.marker is not None and time.monotonic() - made.checked > self._catalog.config.routing.check_s:
            self._schedule(name, check=True)
        if made is None:
            return None, "no summary yet: being made from a sample of it (asked until then)"
        return made.summary, made.why

    def _due(self, made: _Made) -> bool:
        age = time.time() - made.when
        if made.summary is not None:
            return age > self._catalog.config.routing.refresh_s
        wait = min(RETRY_S * 2 ** max(0, made.failures - 1), self._catalog.config.routing.refresh_s)
        return not made.final and age > wait

    def _from_disk(self, name: str, key: str) -> _Made | None:
        path = self._path(name, key)
        if not path.is_file():
            return None
        marker = path.with_suffix(".marker")
        made = _Made(key, path.stat().st_mtime, SourceSummary.load(path), "",
                     marker=marker.read_text() if marker.is_file() else None)
        self._keep(name, made)
        return made

    def _keep(self, name: str, made: _Made) -> None:
        with self._lock:
            before = self._made.get(name)
            self._made[name] = made
            if before is None or before.summary is not made.summary:  # the stacked table moves only then
                self._generation += 1

    def _path(self, name: str, key: str) -> Path:
        return self.root / "cache" / "summaries" / f"{name}-{key}.npz"

    def _schedule(self, name: str, *, check: bool = False) -> None:
        """Make `name`'s summary on the worker, or (`check`) read its change marker and make it if it moved."""
        with self._lock:
            if name in self._pending or self._closed:
                return
            self._pending.add(name)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="gradfuse-summaries", daemon=True)
                self._worker.start()
        self._queue.put((name, check))

    def _work(self) -> None:
        while (job := self._queue.get()) is not None and not self._closed:
            name, check = job
            try:
                if not check or self._changed(name):
                    self.make([name])
            finally:
                with self._lock:
                    self._pending.discard(name)

    def _changed(self, name: str) -> bool:
        """Whether the source's change marker moved since its summary was made (a marker that cannot be read
        now: not known to have moved; it is read again after check_s)."""
        with self._lock:
            made = self._made.get(name)
        if made is None or made.marker is None:
            return True
        try:
            with self._catalog.holding(name) as source:
                marker = source.change_marker()
        except Exception as error:  # the source is down: the search says so; the summary stands until it is back
            LOG.info("change marker of %s not read: %s: %s", name, type(error).__name__, str(error)[:200])
            marker = made.marker
        if marker != made.marker:
            return True
        self._keep(name, dataclasses.replace(made, checked=time.monotonic()))
        return False

    def make(self, names: Iterable[str]) -> dict[str, str]:
        """Make the summaries of `names` that are made from a sample (engines, tables, remotes) now; what each
        came to ("" for made, else why not)."""
        outcome = {}
        for name in names:
            if self._closed:
                break
            try:
                fingerprint = self._catalog.summary_fingerprint(name)
                if fingerprint is not None:
                    outcome[name] = self._make(name, _key(fingerprint, self.encoder))
            except Exception as error:  # never the worker's end: the next source's summary is still made
                LOG.warning("summary of %s not made: %s: %s", name, type(error).__name__, str(error)[:200])
                outcome[name] = f"no summary: {type(error).__name__}: {str(error)[:200]}"
        return outcome

    def _make(self, name: str, key: str) -> str:
        with self._lock:
            before = self._made.get(name)
        failures = before.failures if before is not None and before.key == key and before.summary is None else 0
        try:
            summary, marker = self._sampled(name)
        except Exception as error:  # any failure of the source: it stays unjudged, hence always asked
            why = f"no summary: sampling it failed ({type(error).__name__}: {str(error)[:200]})"
            self._keep(name, _Made(key, time.time(), None, why, failures + 1))
            return why
        if summary is None:
            why = "no summary: this kind of source cannot be sampled (it is always asked)"
            self._keep(name, _Made(key, time.time(), None, why, final=True))
            return why
        # kept in memory even if it cannot be saved
        self._keep(name, _Made(key, time.time(), summary, "", marker=marker, checked=time.monotonic()))
        path = self._path(name, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        summary.save(path)
        if marker is not None:
            path.with_suffix(".marker").write_text(marker)
        else:  # one from an earlier sample would be read back as this one's
            path.with_suffix(".marker").unlink(missing_ok=True)
        mine = re.compile(re.escape(name) + r"-[0-9a-f]{16}\.(npz|marker)")  # not "name-other"'s, another source
        for old in path.parent.iterdir():
            if old.stem != path.stem and mine.fullmatch(old.name):
                old.unlink(missing_ok=True)
        return ""

    def _sampled(self, name: str) -> tuple[SourceSummary | None, str | None]:
        """The source's summary and its change marker, read first: a change while it is sampled is seen later."""
        with self._catalog.holding(name) as source:
            marker = _marker(source)
            if hasattr(source, "summary"):  # another gradfuse: it sends its own
                return source.summary(self.encoder), marker
            if not hasattr(source, "sample_texts"):
                return None, None
            documents, texts = source.sample_texts(SAMPLE_TEXTS)
        return summarize(load_encoder(self.encoder).encode(texts), documents=documents), marker


def _marker(source) -> str | None:
    """The source's change marker, or None where it has none or it cannot be read (then the timer alone)."""
    if not hasattr(source, "change_marker"):
        return None
    try:
        return source.change_marker()
    except Exception as error:  # noqa: BLE001 - a marker is an optimisation: refresh_s still holds
        LOG.info("change marker of %s not read: %s: %s", source.name, type(error).__name__, str(error)[:200])
        return None


def _key(fingerprint: str, encoder: str) -> str:
    return hashlib.sha256(f"{fingerprint}\n{encoder}".encode()).hexdigest()[:16]
