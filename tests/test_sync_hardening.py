"""What a synced or watched folder must never do (issue 69): undo a change of readers, let a limited key count
words in files it may not read, keep an emptied folder's text, or stop on one link that cannot be followed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config, load_config
from gradfuse.indexing.folder_sync import options_published
from gradfuse.indexing.watch import FolderWatcher, FollowedSpecs
from gradfuse.ingest.documents import IngestError
from gradfuse.sources.base import current_version, read_manifest
from test_sync import NOTES, settle, write_notes
from test_watch import Recorder, until

BOB = frozenset({"bob", "eng"})  # a key's readers that name no hr group
PAY = {f"hr/pay{n}.md": f"# Pay {n}\n\nSalary band {n} is reviewed each spring by the board." for n in range(3)}


def bm25_scores(ws: Workspace, query: str, readers=None) -> dict[str, float]:
    with ws.holding("notes", "bm25") as source:
        return {c.doc_id: c.native_score for c in source.search(query, 50, readers=readers)}


def restricted_spec(folder) -> SourceSpec:
    return SourceSpec("notes", "files", str(folder), {"readers": {"hr/*": ["hr"]}})


def test_which_of_many_matching_passages_a_limited_key_gets_turns_on_no_word_of_files_it_may_not_read(tmp_path):
    """More of bob's passages match than are rescored: which ones enter the rescoring must not depend on how many
    hr files hold each word (found by the review: with tantivy's own weights, bob's top five told which)."""
    public = {f"public/a{n}.md": f"alpha {n}" for n in range(210)} | {f"public/b{n}.md": f"beta {n}" for n in range(210)}
    tops = []
    for word in ("gamma", "alpha", "beta"):
        folder = tmp_path / word
        write_notes(folder, {**public, **{f"hr/{n}.md": f"{word} {word} {n}" for n in range(40)}})
        ws = Workspace(Config(workspace=tmp_path / f"ws-{word}"))
        ws.index(restricted_spec(folder))
        with ws.holding("notes", "bm25") as source:
            tops.append([c.doc_id for c in source.search("alpha beta", 5, readers=BOB)])
        ws.close()
    assert tops[0] == tops[1] == tops[2], tops


def test_a_limited_keys_bm25_scores_move_with_no_file_it_may_not_read(tmp_path):
    write_notes(tmp_path / "notes", {**NOTES, **PAY, "public/review.md": "# Review\n\nThe spring review of every "
                                                                         "salary band is published in May."})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = restricted_spec(tmp_path / "notes")
    ws.index(spec)
    before = bm25_scores(ws, "spring salary review", readers=BOB)
    assert before and not any(doc.startswith("hr/") for doc in before)
    owner_before = bm25_scores(ws, "spring salary review")
    settle(ws, spec)
    for n in range(3):  # hr files gain the words, and hr grows: nothing bob reads changes
        (tmp_path / "notes" / f"hr/pay{n}.md").write_text(f"Spring review: salary review of band {n}, spring.")
    write_notes(tmp_path / "notes", {f"hr/extra{n}.md": "spring " * (n + 1) for n in range(5)})
    assert ws.index(spec).status == "built"
    assert bm25_scores(ws, "spring salary review", readers=BOB) == before
    assert bm25_scores(ws, "spring salary review") != owner_before  # the owner reads hr: his do move


def test_a_sync_that_drops_files_scores_bm25_as_a_fresh_build_does(tmp_path):
    write_notes(tmp_path / "notes", {**NOTES, **{f"old/{n}.md": f"The billing database backup {n}." for n in range(8)}})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    settle(ws, spec)
    for n in range(8):
        (tmp_path / "notes" / f"old/{n}.md").unlink()
    (tmp_path / "notes" / "kitchen.txt").write_text("The billing team moved next to the espresso machine.")
    assert ws.index(spec).files["deleted"] == 8
    fresh = Workspace(Config(workspace=tmp_path / "fresh"))
    fresh.index(spec)
    for query in ("billing database backup", "espresso machine", "paid leave a year"):
        synced, built = bm25_scores(ws, query), bm25_scores(fresh, query)
        assert synced.keys() == built.keys()
        assert all(abs(synced[doc] - built[doc]) < 1e-5 for doc in built), query


def test_an_emptied_folder_publishes_an_empty_source_and_a_first_build_of_nothing_fails(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    assert bm25_scores(ws, "espresso machine")
    settle(ws, spec)
    for name in NOTES:
        (tmp_path / "notes" / name).unlink()
    (tmp_path / "notes" / "empty.txt").write_text("")  # a file that is skipped: still nothing to serve
    report = ws.index(spec)
    assert report.status == "built" and report.documents == 0 and report.files["deleted"] == len(NOTES)
    assert bm25_scores(ws, "espresso machine") == {}
    with ws.holding("notes", "dense") as source:
        assert source.search("espresso machine", 5) == []
    assert {name: s.documents for name, s, _ in ws.source_health()}["notes"] == 0
    write_notes(tmp_path / "notes", {"back.md": "The espresso machine is back."})  # and it fills again
    assert ws.index(spec).documents == 1 and list(bm25_scores(ws, "espresso machine")) == ["back.md#0"]
    with pytest.raises(IngestError, match="holds no documents"):
        (tmp_path / "nothing").mkdir()
        ws.index(SourceSpec("other", "files", str(tmp_path / "nothing")))


def test_a_looping_link_is_skipped_and_named_and_the_folder_still_syncs(tmp_path):
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    os.symlink("loop.md", tmp_path / "notes" / "loop.md")
    os.symlink("nowhere.md", tmp_path / "notes" / "dangling.md")
    write_notes(tmp_path / "notes", {"new.md": "The plotter prints posters."})
    (tmp_path / "notes" / "kitchen.txt").unlink()
    report = ws.index(spec)
    assert report.status == "built" and report.files["added"] == 1 and report.files["deleted"] == 1
    skipped = {name: detail for name, _, detail in report.skipped}
    assert skipped["loop.md"] == "Too many levels of symbolic links" and skipped["dangling.md"] == "a link that leads nowhere"


def test_gradfuse_build_builds_every_source_and_names_each_failure_at_the_end(tmp_path):
    write_notes(tmp_path / "a", {"a.md": "Alpha notes."})
    write_notes(tmp_path / "c", {"c.md": "Gamma notes."})
    (tmp_path / "gradfuse.toml").write_text(textwrap.dedent(f"""
        [sources.a]
        kind = "files"
        path = "{tmp_path / 'a'}"
        [sources.b]
        kind = "files"
        path = "{tmp_path / 'missing'}"
        [sources.c]
        kind = "files"
        path = "{tmp_path / 'c'}"
    """))
    gradfuse = str(Path(sys.executable).parent / "gradfuse")
    done = subprocess.run([gradfuse, "build", "--config", str(tmp_path / "gradfuse.toml")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "c: built 1 documents" in done.stdout and "1 of 3 source(s) failed" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].strip().startswith("b: ")
    for name in ("a", "c"):
        assert current_version(tmp_path / ".gradfuse" / "sources" / name) is not None


def _config(tmp_path, readers: bool) -> None:
    rules = '[sources.notes.readers]\n"hr/*" = ["hr"]\n' if readers else ""
    (tmp_path / "gradfuse.toml").write_text(f'workspace = "ws"\n[sources.notes]\nkind = "files"\n'
                                            f'path = "{tmp_path / "notes"}"\n{rules}')


def test_a_running_watcher_follows_a_change_of_readers_and_never_undoes_it(tmp_path):
    """H1: readers added to the config and built while a watcher runs stay: the watcher's next sync reads the
    configuration again, so hr/ stays closed to a limited key."""
    write_notes(tmp_path / "notes", {**NOTES, **PAY})
    _config(tmp_path, readers=False)
    ws = Workspace(load_config(tmp_path / "gradfuse.toml"))
    from gradfuse.cli.watching import workspace_watcher

    record = Recorder()
    watcher = workspace_watcher(ws, record, debounce_s=0.3, rescan_s=3600)
    with watcher:
        until(record.built, "the first sync")
        assert any(doc.startswith("hr/") for doc in bm25_scores(ws, "salary band", readers=BOB))
        _config(tmp_path, readers=True)
        built = Workspace(load_config(tmp_path / "gradfuse.toml")).build_configured()
        assert built[0].status == "built"
        source_dir = tmp_path / "ws" / "sources" / "notes"
        assert read_manifest(current_version(source_dir))["restricted"] == 5
        synced = len(record.synced)
        (tmp_path / "notes" / "kitchen.txt").write_text("The espresso machine moved to the fourth floor.")
        until(lambda: len(record.synced) > synced, "the watcher's sync of the save")
        assert record.synced[-1].error is None
        assert read_manifest(current_version(source_dir))["restricted"] == 5
        assert not any(doc.startswith("hr/") for doc in bm25_scores(ws, "salary band", readers=BOB))


def test_a_sync_whose_options_were_read_before_another_build_published_others_writes_nothing(tmp_path):
    write_notes(tmp_path / "notes", {**NOTES, **PAY})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    plain, restricted = SourceSpec("notes", "files", str(tmp_path / "notes")), restricted_spec(tmp_path / "notes")
    ws.index(plain)
    source_dir = tmp_path / "ws" / "sources" / "notes"
    seen = options_published(source_dir)  # a watcher read `plain`'s options here ...
    ws.index(restricted)  # ... then a build published other options
    with pytest.raises(Exception, match="published with other options by another build"):
        ws.index(plain, options_seen=seen)
    assert read_manifest(current_version(source_dir))["restricted"] == 5


def test_a_build_that_adds_readers_while_a_watcher_syncs_the_old_options_publishes_them(tmp_path):
    """The watcher's own syncs with the options a build read are no reason to refuse that build (found by the
    review: adding a readers rule kept failing under churn, and hr/ stayed open)."""
    write_notes(tmp_path / "notes", {**NOTES, **PAY})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    plain = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(plain)
    source_dir = tmp_path / "ws" / "sources" / "notes"
    seen = options_published(source_dir)  # `gradfuse build` read the published options ...
    write_notes(tmp_path / "notes", {"new.md": "A new note."})
    assert ws.index(plain).status == "built"  # ... a watcher published a change with them meanwhile ...
    assert ws.index(restricted_spec(tmp_path / "notes"), options_seen=seen).status == "built"  # ... it applies
    assert read_manifest(current_version(source_dir))["restricted"] == 5


def test_a_limited_key_is_scored_from_live_passages_where_bm25_still_holds_deleted_ones(tmp_path, monkeypatch):
    """Above REWRITE_BM25_ROWS a sync only marks dropped passages deleted, and their counts stay in tantivy's
    statistics: a key limited to some documents is scored from the live ones even where none is restricted."""
    from gradfuse.sources import embedded

    monkeypatch.setattr(embedded, "REWRITE_BM25_ROWS", 0)
    scores = []
    for deleted in (3, 12):
        folder = tmp_path / f"notes-{deleted}"
        write_notes(folder, {**{f"public/{n}.md": f"Green apples, crate {n}." for n in range(20)},
                             **{f"hr/{n}.md": f"apples apples {n}" for n in range(deleted)}})
        ws = Workspace(Config(workspace=tmp_path / f"ws-{deleted}"))
        spec = restricted_spec(folder)
        ws.index(spec)
        settle(ws, spec)
        for n in range(deleted):
            (folder / f"hr/{n}.md").unlink()
        report = ws.index(spec)
        assert report.files["deleted"] == deleted
        assert read_manifest(current_version(tmp_path / f"ws-{deleted}" / "sources" / "notes"))["restricted"] == 0
        scores.append(bm25_scores(ws, "apples crate", readers=BOB))
        assert bm25_scores(ws, "apples " * 2000, readers=BOB)  # a pasted page is scored too
        ws.close()
    assert scores[0] == scores[1] and len(scores[0]) == 20


def test_a_watcher_syncs_with_the_options_its_source_was_published_with_not_those_it_started_with(tmp_path):
    """Option changes are `gradfuse build`'s to publish: a watcher never applies a configuration (a half-saved one
    could drop a readers table for a moment), nor the options it started with."""
    write_notes(tmp_path / "notes", {**NOTES, **PAY})
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    plain = SourceSpec("notes", "files", str(tmp_path / "notes"))
    followed = FollowedSpecs(tmp_path / "ws", [plain])
    assert followed.now("notes") == (plain, "", None)  # not built yet: as declared
    ws.index(restricted_spec(tmp_path / "notes"))
    spec, seen, encoder = followed.now("notes")
    assert spec.options == {"readers": {"hr/*": ["hr"]}} and seen == options_published(
        tmp_path / "ws" / "sources" / "notes") and encoder == ws.config.encoder + "@float32"
    record = Recorder()
    with FolderWatcher([plain], lambda s: ws.index(*followed.now(s.name)[:1], wait=True), done=record,
                       debounce_s=0.2, rescan_s=3600):
        until(lambda: record.synced, "the first sync")
    assert record.synced[0].error is None
    assert read_manifest(current_version(tmp_path / "ws" / "sources" / "notes"))["restricted"] == 5


def test_the_library_builds_every_declared_source_then_raises_with_each_report(tmp_path):
    from gradfuse.indexing.report import BuildsFailed

    write_notes(tmp_path / "a", {"a.md": "Alpha notes."})
    (tmp_path / "gradfuse.toml").write_text(f'workspace = "ws"\n[sources.b]\nkind = "files"\npath = "{tmp_path / "gone"}"'
                                            f'\n[sources.a]\nkind = "files"\npath = "{tmp_path / "a"}"\n')
    with pytest.raises(BuildsFailed, match="1 of 2 source") as raised:
        Workspace(load_config(tmp_path / "gradfuse.toml")).build_configured()
    assert [(r.name, r.status) for r in raised.value.reports] == [("b", "failed"), ("a", "built")]
    (tmp_path / "dup.jsonl").write_text('{"id": "x", "text": "one"}\n{"id": "x", "text": "two"}\n')
    (tmp_path / "gradfuse.toml").write_text(f'workspace = "ws"\n[sources.dup]\nkind = "jsonl"\npath = "{tmp_path / "dup.jsonl"}"'
                                            f'\n[sources.a]\nkind = "files"\npath = "{tmp_path / "a"}"\n')
    with pytest.raises(BuildsFailed, match="duplicate document id") as raised:
        Workspace(load_config(tmp_path / "gradfuse.toml")).build_configured()
    assert [r.status for r in raised.value.reports] == ["failed", "unchanged"]


def test_a_sync_that_read_the_old_encoder_does_not_write_over_a_build_with_a_new_one(tmp_path):
    """A watcher's sync waiting for the lock while `gradfuse build` re-embeds with another encoder would have
    written the source whole with the old one again (found by the review)."""
    write_notes(tmp_path / "notes", NOTES)
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    spec = SourceSpec("notes", "files", str(tmp_path / "notes"))
    ws.index(spec)
    source_dir = tmp_path / "ws" / "sources" / "notes"
    seen = options_published(source_dir)
    ws.index(spec, encoder="all-MiniLM-L6-v2@bfloat16")
    with pytest.raises(Exception, match="published with other options by another build"):
        ws.index(spec, options_seen=seen)
    assert read_manifest(current_version(source_dir))["encoder"] == "all-MiniLM-L6-v2@bfloat16"
