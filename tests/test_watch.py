"""Folder sources kept current while a process runs (indexing/watch.py): `FolderWatcher` on real file events, and
`gradfuse serve --watch` answering from each change once it is published."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.indexing.watch import FolderWatcher, Synced, folder_specs
from gradfuse.sources.base import current_version, read_manifest
from live_server import gradfuse_serve
from test_sync import NOTES, write_notes

PATIENCE_S = 120  # how long a test waits for a change to be published before it fails (not a measured latency)


def until(check, what: str):
    """Poll `check` until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {PATIENCE_S} s: {what}")


class Recorder:
    def __init__(self):
        self.synced: list[Synced] = []
        self._lock = threading.Lock()

    def __call__(self, synced: Synced) -> None:
        with self._lock:
            self.synced.append(synced)

    def built(self) -> list[Synced]:
        with self._lock:
            return [s for s in self.synced if s.report is not None and s.report.status == "built"]


def top_file(ws: Workspace, query: str) -> str | None:
    with ws.holding("notes", "bm25") as notes:
        found = notes.search(query, 1)
    return found[0].parent_id if found else None


def test_a_watched_folder_publishes_edits_additions_renames_and_deletions(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    record = Recorder()
    with FolderWatcher([spec], lambda s: ws.index(s, wait=True), done=record, debounce_s=0.3, rescan_s=3600):
        until(record.built, "the first sync builds the source")
        (tmp_path / "notes" / "kitchen.txt").write_text("The espresso machine now stands next to the library.")
        until(lambda: top_file(ws, "espresso library") == "kitchen.txt", "an edit")
        write_notes(tmp_path / "notes", {"ops/printers.md": "# Printers\n\nThe plotter prints A0 posters."})
        until(lambda: top_file(ws, "plotter posters") == "ops/printers.md", "an addition")
        (tmp_path / "notes" / "roof").mkdir()
        (tmp_path / "notes" / "garden.txt").rename(tmp_path / "notes" / "roof" / "garden.txt")
        until(lambda: top_file(ws, "fig tree founders") == "roof/garden.txt", "a rename into a new folder")
        assert top_file(ws, "on-call engineer pages") == "ops/oncall.md"
        (tmp_path / "notes" / "ops" / "oncall.md").unlink()
        until(lambda: top_file(ws, "on-call engineer pages") != "ops/oncall.md", "a deletion")
    assert all(s.error is None for s in record.synced)


def test_a_burst_of_a_thousand_new_files_is_published_in_a_few_syncs(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    record = Recorder()
    source_dir = tmp_path / "ws" / "sources" / "notes"
    with FolderWatcher([spec], lambda s: ws.index(s, wait=True), done=record, debounce_s=0.5, rescan_s=3600):
        until(record.built, "the first sync builds the source")
        before = len(record.built())
        burst = tmp_path / "notes" / "burst"
        burst.mkdir()
        for n in range(1000):
            (burst / f"ticket-{n:04d}.txt").write_text(f"Ticket {n}: printer {n % 17} on floor {n % 5} jams.")
        until(lambda: read_manifest(current_version(source_dir))["documents"] == 1006, "every file of the burst")
    after = record.built()[before:]
    assert 1 <= len(after) <= 10  # coalesced: not one sync a file
    assert sum(s.report.files["added"] for s in after) == 1000


def test_folder_specs_are_the_declared_ones_and_those_indexed_from_the_command_line(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    write_notes(tmp_path / "other", {"a.txt": "alpha"})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("notes", "files", str(tmp_path / "notes"), {"chunk_words": 50}))
    ws.index(SourceSpec("other", "files", str(tmp_path / "other")))
    declared = SourceSpec("other", "files", str(tmp_path / "other"), {"chunk_words": 80})
    specs = {spec.name: spec for spec in folder_specs(tmp_path / "ws", [declared])}
    assert specs["other"] == declared  # the config's options win
    assert specs["notes"].options == {"chunk_words": 50} and Path(specs["notes"].path) == (tmp_path / "notes")


def test_a_watched_server_answers_from_an_edit_and_stops_citing_a_deleted_file(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("notes", "files", str(tmp_path / "notes")))
    ws.close()

    def top(url: str, query: str) -> str | None:
        found = httpx.post(url + "/search", json={"query": query, "method": "rrf", "k": 3, "retrieval": "bm25"},
                           timeout=60).json()["candidates"]
        return found[0]["doc_id"] if found else None

    with gradfuse_serve(tmp_path / "ws", "--watch", env={"GRADFUSE_API_KEY": ""}) as url:
        assert top(url, "espresso machine") == "kitchen.txt#0"
        (tmp_path / "notes" / "kitchen.txt").write_text("The espresso machine is replaced by a samovar in May.")
        until(lambda: top(url, "samovar May") == "kitchen.txt#0", "the server answers from the edit")
        assert top(url, "fig tree founders roof garden") == "garden.txt#0"
        (tmp_path / "notes" / "garden.txt").unlink()
        until(lambda: top(url, "fig tree founders roof garden") != "garden.txt#0", "the deleted file uncited")
