"""A folder source synced file by file (indexing/folder_sync.py): only what changed is read, and the result is
what a fresh build of the folder would be."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.ingest.files import FileReader
from gradfuse.sources.base import current_version, read_manifest

NOTES = {
    "ops/backup.md": "# Backups\n\nThe nightly backup of the billing database runs at 02:30 and is kept for 35 days.",
    "ops/oncall.md": "# On call\n\nThe on-call engineer answers pages within fifteen minutes, day or night.",
    "hr/leave.md": "# Leave\n\nEvery employee has twenty-six days of paid leave a year, plus public holidays.",
    "hr/travel.txt": "Train travel is booked in second class; flights over six hours may be booked in premium economy.",
    "kitchen.txt": "The espresso machine on the third floor is descaled every Friday afternoon by facilities.",
    "garden.txt": "The roof garden grows tomatoes, basil and a fig tree planted by the founders in 2009.",
}


def write_notes(folder: Path, notes: dict[str, str]) -> None:
    for name, text in notes.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def settle(ws: Workspace, spec: SourceSpec) -> None:
    """Past the window in which a file written just before a sync looked at it is not trusted by its stat
    (file_stamps.RACY_NS), and one sync that hashes those files again."""
    time.sleep(2.1)
    assert ws.index(spec).status == "unchanged"


@pytest.fixture
def reads(monkeypatch):
    """The files each sync opened: FileReader.read, counted on its way through (the real read runs)."""
    opened: list[str] = []
    real = FileReader.read

    def counted(self, relative, **options):
        opened.append(relative)
        return real(self, relative, **options)

    monkeypatch.setattr(FileReader, "read", counted)
    return opened


def files_in(ws: Workspace, query: str, mode: str = "bm25", k: int = 10) -> list[str]:
    with ws.holding("notes", mode) as source:
        return [c.parent_id for c in source.search(query, k)]


def test_a_sync_reads_only_what_changed_and_publishes_edits_additions_renames_and_deletions(tmp_path, reads):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    first = ws.index(spec)
    assert first.status == "built" and first.files["added"] == 6 and sorted(reads) == sorted(NOTES)
    settle(ws, spec)
    reads.clear()
    assert ws.index(spec).status == "unchanged" and reads == []  # nothing opened

    (tmp_path / "notes" / "kitchen.txt").write_text("The espresso machine moved to the fourth floor, next to the "
                                                   "library, and is descaled on Mondays.")
    (tmp_path / "notes" / "ops" / "oncall.md").unlink()
    (tmp_path / "notes" / "garden.txt").rename(tmp_path / "notes" / "roof-garden.txt")
    write_notes(tmp_path / "notes", {"ops/printers.md": "# Printers\n\nThe plotter in room 4.12 prints A0 posters."})
    synced = ws.index(spec)
    assert synced.status == "built"
    assert synced.files == {"listed": 6, "hashed": 0, "read": 3, "added": 2, "changed": 1, "deleted": 2,
                            "unchanged": 3}
    assert sorted(reads) == ["kitchen.txt", "ops/printers.md", "roof-garden.txt"]
    assert synced.embedded_now == 3
    for mode in ("bm25", "dense"):
        assert files_in(ws, "espresso machine fourth floor library", mode)[0] == "kitchen.txt"
        assert files_in(ws, "plotter prints posters", mode)[0] == "ops/printers.md"
        assert files_in(ws, "roof garden fig tree founders", mode)[0] == "roof-garden.txt"
        assert "ops/oncall.md" not in files_in(ws, "on-call engineer answers pages", mode)
        assert "garden.txt" not in files_in(ws, "roof garden fig tree founders", mode)
    assert files_in(ws, "Friday") == [] and files_in(ws, "Mondays") == ["kitchen.txt"]  # the new text only
    version = current_version(tmp_path / "ws" / "sources" / "notes")
    stored = (version / "docs.sqlite").read_bytes()
    assert b"fifteen minutes" not in stored and b"every Friday afternoon" not in stored  # overwritten, not freed
    assert read_manifest(version)["documents"] == 6


def test_a_touched_file_is_hashed_not_parsed_and_publishes_nothing(tmp_path, reads):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    published = current_version(tmp_path / "ws" / "sources" / "notes")
    settle(ws, spec)
    os.utime(tmp_path / "notes" / "kitchen.txt")
    reads.clear()
    synced = ws.index(spec)
    assert synced.status == "unchanged" and reads == ["kitchen.txt"] and synced.files["hashed"] == 1
    assert current_version(tmp_path / "ws" / "sources" / "notes") == published


def test_a_synced_source_ranks_as_a_fresh_build_of_the_same_folder(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    synced_ws = Workspace(Config(workspace=tmp_path / "synced"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    synced_ws.index(spec)
    (tmp_path / "notes" / "hr" / "leave.md").write_text("# Leave\n\nEvery employee has twenty-eight days of paid "
                                                       "leave a year; unused days carry over to March.")
    (tmp_path / "notes" / "kitchen.txt").unlink()
    write_notes(tmp_path / "notes", {"ops/vpn.md": "# VPN\n\nThe VPN certificate is renewed every 90 days."})
    assert synced_ws.index(spec).status == "built"
    fresh_ws = Workspace(Config(workspace=tmp_path / "fresh"))
    fresh_ws.index(spec)
    assert (current_version(tmp_path / "synced" / "sources" / "notes") / "holes.npy").is_file()
    for query in ("how many days of paid leave", "VPN certificate renewal", "backup of the billing database",
                  "espresso machine", "train travel class"):
        with synced_ws.holding("notes", "dense") as synced, fresh_ws.holding("notes", "dense") as fresh:
            got = [(c.doc_id, round(c.native_score, 5)) for c in synced.search(query, 5)]
            assert got == [(c.doc_id, round(c.native_score, 5)) for c in fresh.search(query, 5)]
        assert files_in(synced_ws, query, "bm25", 3) == files_in(fresh_ws, query, "bm25", 3)


def test_holes_past_half_the_rows_make_the_next_sync_write_the_source_whole(tmp_path):
    write_notes(tmp_path / "notes", {"a.txt": "alpha", "b.txt": "bravo", "c.txt": "charlie", "d.txt": "delta"})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    source_dir = tmp_path / "ws" / "sources" / "notes"
    rows = []
    for edit in range(6):
        (tmp_path / "notes" / "a.txt").write_text(f"alpha, edit {edit}")
        assert ws.index(spec).status == "built"
        rows.append(read_manifest(current_version(source_dir))["rows"])
    # 5 rows with 1 hole, ... 9 rows with 5 holes (past half): the sync after it writes 4 rows again
    assert rows == [5, 6, 7, 8, 9, 4]
    assert not (current_version(source_dir) / "holes.npy").exists()
    assert files_in(ws, "alpha edit 5") == ["a.txt"]


def test_readers_rules_hold_for_files_a_sync_adds(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"), {"readers": {"hr/*": ["hr"]}})
    ws.index(spec)
    write_notes(tmp_path / "notes", {"hr/salaries.md": "# Salaries\n\nSalaries are reviewed every April."})
    assert ws.index(spec).status == "built"
    with ws.holding("notes", "bm25") as notes:
        assert [c.parent_id for c in notes.search("salaries reviewed April", 3, readers=frozenset({"hr"}))][0] \
            == "hr/salaries.md"
        assert "hr/salaries.md" not in [c.parent_id for c in notes.search("salaries reviewed April", 3,
                                                                          readers=frozenset({"bob"}))]
    with ws.holding("notes", "dense") as notes:
        assert "hr/salaries.md" not in [c.parent_id for c in notes.search("salaries reviewed April", 6,
                                                                          readers=frozenset({"bob"}))]


SYNC = """
import sys
from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from pathlib import Path
Workspace(Config(workspace=Path(sys.argv[1]))).index(SourceSpec("notes", "files", sys.argv[2]))
"""


def test_a_sync_killed_mid_way_leaves_the_last_version_and_the_next_sync_finishes_its_work(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    source_dir = tmp_path / "ws" / "sources" / "notes"
    published = current_version(source_dir)
    # Enough new text that the sync is still embedding when it is killed
    write_notes(tmp_path / "notes", {f"log/day-{n:03d}.txt": f"Day {n}: the build farm ran {n * 7} jobs; queue "
                                     f"{n % 13} was the longest, and rack {n % 5} was serviced." for n in range(400)})
    sync = subprocess.Popen([sys.executable, "-c", SYNC, str(tmp_path / "ws"), str(tmp_path / "notes")])
    try:
        deadline = time.monotonic() + 120
        while not list(source_dir.glob("build-*")):
            assert sync.poll() is None, "the sync ended before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.5)
        os.kill(sync.pid, signal.SIGKILL)
    finally:
        sync.wait()
    assert current_version(source_dir) == published
    assert files_in(ws, "nightly backup billing database")[0] == "ops/backup.md"
    finished = ws.index(spec)
    assert finished.status == "built" and finished.files["added"] == 400 and finished.files["unchanged"] == 6
    assert not list(source_dir.glob("build-*"))
    assert files_in(ws, "Day 123 build farm jobs", "bm25", 1) == ["log/day-123.txt"]
    assert read_manifest(current_version(source_dir))["documents"] == 406


def test_a_source_with_an_approximate_index_syncs_it_without_the_dropped_passages(tmp_path, monkeypatch):
    """A large source's IVF index (from ANN_MIN_VECTORS on) is changed as the rest: the new passages added to it,
    the dropped ones removed, and holes never returned (here the threshold is lowered to a folder of 60 files)."""
    from gradfuse.sources import embedded

    monkeypatch.setattr(embedded, "ANN_MIN_VECTORS", 50)
    topics = ["volcano", "glacier", "desert", "reef", "canyon", "prairie"]
    write_notes(tmp_path / "notes", {f"{topic}-{n}.txt": f"Field note {n} about the {topic}: {topic} survey day {n}."
                                     for topic in topics for n in range(10)})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    assert (current_version(tmp_path / "ws" / "sources" / "notes") / embedded.ANN_FILE).is_file()
    for n in range(10):
        (tmp_path / "notes" / f"volcano-{n}.txt").unlink()
    write_notes(tmp_path / "notes", {"lagoon.txt": "Field note about the lagoon: lagoon survey, flamingos."})
    assert ws.index(spec).status == "built"
    with ws.holding("notes", "dense") as notes:
        assert notes._ann is not None  # the approximate index answers
        found = [c.parent_id for c in notes.search("volcano survey field note", 20)]
        assert found and not any(name.startswith("volcano") for name in found)
        assert notes.search("lagoon flamingos", 1)[0].parent_id == "lagoon.txt"
    for n in range(10):  # a sync that only drops files: nothing to add to the index
        (tmp_path / "notes" / f"glacier-{n}.txt").unlink()
    assert ws.index(spec).status == "built"
    with ws.holding("notes", "dense") as notes:
        found = [c.parent_id for c in notes.search("glacier survey field note", 20)]
        assert found and not any(name.startswith(("glacier", "volcano")) for name in found)


def test_a_hard_link_across_readers_made_after_a_build_takes_both_paths_out_until_it_goes(tmp_path):
    """Issue 58's L3 through a sync: hr/pay.md, indexed for hr, gets a hard link in public/; neither may stay
    searchable (the public path would give everyone hr's text), and both come back once the link is gone."""
    write_notes(tmp_path / "wiki", {"hr/pay.md": "# Pay\n\nSalaries are paid on the last working day.\n",
                                    "public/office.md": "# Office\n\nThe office opens at eight.\n"})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("wiki", "files", str(tmp_path / "wiki"), {"readers": {"hr/*": ["hr"]}})
    ws.index(spec)
    hr = frozenset({"hr"})

    def found(readers) -> set[str]:
        with ws.holding("wiki", "bm25") as wiki:
            return {c.parent_id for c in wiki.search("salaries paid office", 5, readers=readers)}

    assert found(hr) == {"hr/pay.md", "public/office.md"}
    (tmp_path / "wiki" / "public" / "pay.md").hardlink_to(tmp_path / "wiki" / "hr" / "pay.md")
    synced = ws.index(spec)
    assert {file for file, reason, _ in synced.skipped if reason == "hard link"} == {"hr/pay.md", "public/pay.md"}
    assert found(hr) == {"public/office.md"} and found(None) == {"public/office.md"}
    (tmp_path / "wiki" / "public" / "pay.md").unlink()
    ws.index(spec)
    assert found(hr) == {"hr/pay.md", "public/office.md"} and found(frozenset({"bob"})) == {"public/office.md"}


def test_a_new_version_of_the_readers_output_or_other_options_write_the_source_whole(tmp_path, monkeypatch):
    from gradfuse.indexing import folder_sync

    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    monkeypatch.setattr(folder_sync, "PARSE_VERSION", folder_sync.PARSE_VERSION + 1)  # a reader's output changed
    again = ws.index(spec)
    assert again.status == "built" and again.files["added"] == len(NOTES) and again.embedded_now == 0
    chunked = ws.index(SourceSpec("notes", "files", str(tmp_path / "notes"), {"chunk_words": 8}))
    assert chunked.files["added"] == len(NOTES) and chunked.documents > len(NOTES)
