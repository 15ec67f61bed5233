"""Folder sources kept current while a process runs (`gradfuse watch`, `gradfuse serve --watch`).

File events (watchdog: inotify on Linux) mark a source changed; once its folder has been quiet for `debounce_s`
(or `longest_wait_s` after the first change, when writes never stop), one sync publishes every change of the
burst (indexing/folder_sync.py). Every `rescan_s` each source is synced anyway: the fallback where no events come
(a network filesystem, a folder past the system's inotify limit), and cheap where nothing changed (the folder is
listed, no file is read). A sync that fails (a file mid-write, a full disk) is reported and tried again on the
next change or rescan; the published version stays whole meanwhile, as after any failed build.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import EVENT_TYPE_CLOSED_NO_WRITE, EVENT_TYPE_OPENED, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from gradfuse.embedding.encoder_names import recorded_encoder
from gradfuse.indexing.folder_sync import published_with
from gradfuse.indexing.report import BuildReport
from gradfuse.ingest.readers.isolation import parser_kept
from gradfuse.sources.base import SourceSpec, current_version, read_manifest

log = logging.getLogger("gradfuse.watch")

DEBOUNCE_S = 0.5  # quiet time after the last event of a burst before it is synced
LONGEST_WAIT_S = 5.0  # a folder written without pause is still synced this often
RESCAN_S = 60.0  # every source is synced this often without an event (see the module's docstring)


@dataclass(frozen=True)
class Synced:
    """One sync the watcher ran: its report, or the error it failed with."""

    name: str
    report: BuildReport | None
    error: str | None = None


def folder_specs(workspace: Path, declared: list[SourceSpec]) -> list[SourceSpec]:
    """The folder sources to watch: those the config declares, with their options, and those indexed from the
    command line (`gradfuse index files`), with the folder and options their last build recorded."""
    specs = {spec.name: spec for spec in declared if spec.kind == "files"}
    sources = workspace / "sources"
    for folder in sorted(sources.iterdir()) if sources.is_dir() else ():
        version = current_version(folder)
        if folder.name in specs or version is None:
            continue
        manifest = read_manifest(version)
        if manifest.get("kind") == "files" and folder.name not in {spec.name for spec in declared}:
            specs[folder.name] = SourceSpec(folder.name, "files", manifest["input"], manifest.get("options", {}))
    return list(specs.values())


class FollowedSpecs:
    """Each watched source as its published version was built: a sync keeps the options (readers rules, chunking,
    limits) the last build published and never applies the configuration on its own. A watcher that kept the
    options it read at its start undid a readers rule that `gradfuse build` had since published; one that applied
    the configuration file at each sync would publish a half-saved edit (a readers table dropped for a moment). A
    change of options is `gradfuse build`'s to publish; a source not yet built is built as `watched` says."""

    def __init__(self, workspace: Path, watched: list[SourceSpec]):
        self._workspace, self._watched = workspace, {spec.name: spec for spec in watched}

    def now(self, name: str) -> tuple[SourceSpec, str, str | None]:
        """(the source's spec as its published version has it, its folder and options as compared by a sync
        (`published_with`, "" for none), the encoder it was built with (None: the configured one)). A sync given
        them publishes nothing when another build has since published other options (indexing/folder_sync.py):
        the next sync reads them."""
        version = current_version(self._workspace / "sources" / name)
        if version is None:
            return self._watched[name], "", None
        manifest = read_manifest(version)
        return (SourceSpec(name, "files", manifest["input"], manifest.get("options", {})), published_with(manifest),
                manifest.get("encoder") and recorded_encoder(manifest["encoder"]))


class FolderWatcher:
    """Watches `specs`' folders and runs `sync(spec)` for each burst of changes, in a thread of its own; `done` is
    called with each sync's outcome. Paths under `ignore` (the workspace, should it lie in a watched folder) are
    not changes."""

    def __init__(self, specs: list[SourceSpec], sync: Callable[[SourceSpec], BuildReport], *,
                 done: Callable[[Synced], None] = lambda synced: None, ignore: list[Path] = (),
                 debounce_s: float = DEBOUNCE_S, longest_wait_s: float = LONGEST_WAIT_S, rescan_s: float = RESCAN_S):
        self._specs = {spec.name: spec for spec in specs}
        self._sync, self._done = sync, done
        self._ignore = [str(path.resolve()) for path in ignore]
        self._debounce_s, self._longest_wait_s, self._rescan_s = debounce_s, longest_wait_s, rescan_s
        self._changed: dict[str, tuple[float, float]] = {}  # name: (first, last) event of the pending burst
        self._synced_at: dict[str, float] = {}
        self._condition = threading.Condition()
        self._stopping = False
        self._observer = Observer()
        self._thread = threading.Thread(target=self._run, name="gradfuse-watch", daemon=True)
        self.unwatched: dict[str, str] = {}  # sources without file events (why): the rescan keeps them current

    @property
    def rescan_s(self) -> float:
        """Seconds between syncs of a source without a file event."""
        return self._rescan_s

    @property
    def sources(self) -> list[str]:
        return list(self._specs)

    def start(self) -> FolderWatcher:
        for spec in self._specs.values():
            try:
                self._observer.schedule(_EventHandler(self, spec.name), str(Path(spec.path).resolve()), recursive=True)
            except OSError as error:  # no such folder, or the inotify watch limit reached
                self.unwatched[spec.name] = error.strerror or str(error)
                log.warning("no file events for %s (%s): it is rescanned every %g s", spec.name,
                            self.unwatched[spec.name], self._rescan_s)
        self._observer.start()
        now = time.monotonic()
        with self._condition:  # a first sync of each: changes made while nothing watched are published now
            self._changed = {name: (now, now) for name in self._specs}
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._observer.stop()
        self._observer.join()
        self._thread.join()

    def __enter__(self) -> FolderWatcher:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def changed(self, name: str, path: str) -> None:
        if any(path == ignored or path.startswith(ignored + "/") for ignored in self._ignore):
            return
        now = time.monotonic()
        with self._condition:
            first, _ = self._changed.get(name, (now, now))
            self._changed[name] = (first, now)
            self._condition.notify_all()

    def _due(self, now: float) -> tuple[list[str], float]:
        """The sources to sync now, and how long until the next one is due."""
        due, wait = [], self._rescan_s
        for name in self._specs:
            if name in self._changed:
                first, last = self._changed[name]
                at = min(last + self._debounce_s, first + self._longest_wait_s)
            else:
                at = self._synced_at.get(name, now) + self._rescan_s
            if at <= now:
                due.append(name)
            else:
                wait = min(wait, at - now)
        return due, wait

    def _run(self) -> None:
        with parser_kept():  # one parser process for every sync, not one each
            while True:
                with self._condition:
                    due, wait = self._due(time.monotonic())
                    while not due and not self._stopping:
                        self._condition.wait(wait)
                        due, wait = self._due(time.monotonic())
                    if self._stopping:
                        return
                    for name in due:
                        self._changed.pop(name, None)  # events from here on make another burst
                for name in due:
                    self._synced_at[name] = time.monotonic()
                    synced = self._run_sync(name)
                    try:
                        self._done(synced)
                    except Exception:  # a report that cannot be printed must not stop the watching
                        log.exception("reporting the sync of %s failed", name)

    def _run_sync(self, name: str) -> Synced:
        try:
            return Synced(name, self._sync(self._specs[name]))
        except Exception as error:  # this source only, and only this time: the next change or rescan retries
            log.warning("sync of %s failed: %s", name, error)
            return Synced(name, None, f"{type(error).__name__}: {error}")


class _EventHandler(FileSystemEventHandler):
    def __init__(self, watcher: FolderWatcher, name: str):
        self._watcher, self._name = watcher, name

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in (EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE):  # reads, the sync's own included
            return
        self._watcher.changed(self._name, str(event.src_path))
        if getattr(event, "dest_path", ""):
            self._watcher.changed(self._name, str(event.dest_path))
