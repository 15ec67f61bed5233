import json
import sqlite3
import subprocess

import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.sources import IngestError, open_source
from gradfuse.sources.base import current_version
from gradfuse.ingest.documents import chunk_text

from conftest import ASTRONOMY, write_jsonl


@pytest.fixture
def ws(tmp_path):
    return Workspace(Config(workspace=tmp_path / "ws"))


def test_beir_folder_becomes_a_searchable_source(workspace):
    source = workspace.source("astronomy", "bm25")
    hits = source.search("largest gas giant planet", 2)
    assert hits[0].doc_id == "jupiter" and hits[0].native_rank == 1 and hits[0].source == "astronomy"
    assert hits[0].native_score > hits[1].native_score
    dense = workspace.source("astronomy", "dense").search("which planet is the hottest", 1)
    assert dense[0].doc_id == "venus" and 0 < dense[0].native_score <= 1
    stats = source.stats()
    assert (stats.kind, stats.documents, stats.encoder) == ("beir", 3, "all-MiniLM-L6-v2@float32") and stats.index_bytes > 0


def test_files_are_chunked_with_overlap_and_keep_their_span(ws, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    words = [f"w{i}" for i in range(50)]
    (notes / "long.txt").write_text(" ".join(words))
    (notes / "page.html").write_text("<html><head><title>Oort</title><script>var x=1;</script></head>"
                                     "<body><p>The Oort cloud surrounds the Sun.</p></body></html>")
    (notes / "readme.md").write_text("# Comets\nComets have tails that point away from the Sun.")
    report = ws.index(SourceSpec("notes", "files", str(notes), {"chunk_words": 20, "chunk_overlap": 5}))
    assert report.status == "built" and report.documents == 3 + 2  # 50 words → windows at 0, 15, 30
    db = sqlite3.connect(current_version(ws.root / "sources" / "notes") / "docs.sqlite")
    rows = db.execute("SELECT doc_id, parent_id, span_start, span_end, text, title FROM docs").fetchall()
    text = (notes / "long.txt").read_text()
    chunks = [r for r in rows if r[1] == "long.txt"]
    assert [r[0] for r in chunks] == ["long.txt#0", "long.txt#1", "long.txt#2"]
    for _, _, start, end, chunk, _ in chunks:
        assert text[start:end] == chunk  # the span points at the chunk inside its parent
    assert chunks[0][4].split()[-5:] == chunks[1][4].split()[:5]  # consecutive chunks share the overlap
    html = next(r for r in rows if r[1] == "page.html")
    assert html[5] == "Oort" and "var x" not in html[4] and "Oort cloud" in html[4]
    assert next(r for r in rows if r[1] == "readme.md")[5] == "Comets"


def test_chunk_text_rejects_overlap_not_smaller_than_chunk():
    with pytest.raises(ValueError, match="overlap"):
        chunk_text("a b c", words=3, overlap=3)


def test_unchanged_reindex_is_a_noop_and_changes_embed_only_new_text(ws, tmp_path):
    corpus = write_jsonl(tmp_path / "a.jsonl", ASTRONOMY)
    first = ws.index(SourceSpec("a", "jsonl", str(corpus)))
    version = current_version(ws.root / "sources" / "a")
    again = ws.index(SourceSpec("a", "jsonl", str(corpus)))
    assert (first.status, first.embedded_now) == ("built", 3)
    assert again.status == "unchanged" and current_version(ws.root / "sources" / "a") == version
    write_jsonl(corpus, ASTRONOMY + [{"id": "pluto", "text": "Pluto is a dwarf planet in the Kuiper belt."}])
    changed = ws.index(SourceSpec("a", "jsonl", str(corpus)))
    assert (changed.status, changed.documents, changed.embedded_now) == ("built", 4, 1)
    assert not version.exists()  # the superseded version is cleaned up after the swap
    assert ws.source("a", "bm25").search("dwarf planet Kuiper", 1)[0].doc_id == "pluto"


def test_malformed_jsonl_line_is_an_error_naming_file_and_line_or_skipped_by_option(ws, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ASTRONOMY[0]) + "\n{not json\n" + json.dumps({"title": "no id"}) + "\n")
    with pytest.raises(IngestError, match=r"bad\.jsonl:2: invalid JSON"):
        ws.index(SourceSpec("bad", "jsonl", str(bad)))
    report = ws.index(SourceSpec("bad", "jsonl", str(bad), {"skip_malformed": True}))
    assert report.documents == 1 and report.ingest["skipped_malformed"] == 2


def test_non_utf8_and_empty_files_are_read_or_skipped_and_counted(ws, tmp_path):
    notes = tmp_path / "legacy"
    notes.mkdir()
    (notes / "cafe.txt").write_bytes("Caf\xe9 cr\xe8me recipes from the old wiki.".encode("cp1252"))
    (notes / "empty.md").write_text("")
    (notes / "blank.txt").write_text("   \n\n")
    report = ws.index(SourceSpec("legacy", "files", str(notes)))
    assert report.documents == 1
    assert report.ingest == {"skipped_empty": 2, "skipped_malformed": 0, "decoded_with_fallback": 1,
                             "skipped_links_outside": 0, "skipped_binary": 0, "chunked_long_records": 0,
                             "skipped_unreadable": 0, "pages_without_text": 0, "read_by_content": 0,
                             "pages_read_by_ocr": 0, "cut_to_limits": 0}
    assert ws.source("legacy", "bm25").search("recipes wiki", 1)[0].text.startswith("Café crème")


def test_an_empty_input_is_a_clear_error(ws, tmp_path):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(IngestError, match="holds no documents"):
        ws.index(SourceSpec("nothing", "files", str(tmp_path / "nothing")))
    with pytest.raises(IngestError, match="not a BEIR folder"):
        ws.index(SourceSpec("x", "beir", str(tmp_path / "nothing")))


def test_trec_run_becomes_a_source_that_answers_its_own_queries(ws, tmp_path):
    corpus = write_jsonl(tmp_path / "run" / "corpus.jsonl", ASTRONOMY)
    write_jsonl(tmp_path / "run" / "queries.jsonl", [{"id": "q1", "text": "Which planet has moons?"}])
    run = tmp_path / "run" / "bm25.trec"
    run.write_text("q1 Q0 venus 2 3.5 bm25\nq1 Q0 mars 1 7.25 bm25\n")
    report = ws.index(SourceSpec("bm25run", "run", str(run), {"corpus": str(corpus)}))
    assert report.documents == 2  # only the documents the run can return are stored
    source = open_source(ws.root, "bm25run")
    hits = source.search("  which planet HAS moons? ", 10)
    assert [(h.doc_id, h.native_rank, h.native_score) for h in hits] == [("mars", 1, 7.25), ("venus", 2, 3.5)]
    with pytest.raises(Exception, match="no ranking for this query"):
        source.search("something else", 10)
    assert source.document("mars").title == "Mars" and source.document("jupiter") is None  # a cited passage again
    assert ws.index(SourceSpec("bm25run", "run", str(run), {"corpus": str(corpus)})).status == "unchanged"
    # cut at a depth, a run keeps each query's first documents in the order a search reads them (score first)
    report = ws.index(SourceSpec("top1", "run", str(run), {"corpus": str(corpus), "depth": 1}))
    assert report.documents == 1 and [h.doc_id for h in open_source(ws.root, "top1").search("which planet has moons?",
                                                                                              10)] == ["mars"]
    with pytest.raises(ValueError, match="depth is how many"):
        SourceSpec("r", "run", str(run), {"corpus": str(corpus), "depth": 0})


def test_bad_trec_line_names_file_and_line(ws, tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ASTRONOMY)
    write_jsonl(tmp_path / "queries.jsonl", [{"id": "q1", "text": "moons"}])
    run = tmp_path / "broken.trec"
    run.write_text("q1 Q0 mars 1 7.25 bm25\nq1 mars 2\n")
    with pytest.raises(IngestError, match=r"broken\.trec:2: expected"):
        ws.index(SourceSpec("r", "run", str(run), {"corpus": str(corpus)}))


def test_crashed_build_leaves_the_previous_version_in_use(ws, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", ASTRONOMY)
    ws.index(SourceSpec("c", "jsonl", str(corpus)))
    published = current_version(ws.root / "sources" / "c")
    (ws.root / "sources" / "c" / "build-20000101T000000000000-1").mkdir()  # what a killed build leaves behind
    assert current_version(ws.root / "sources" / "c") == published
    assert open_source(ws.root, "c", mode="bm25").search("moons", 1)[0].doc_id == "mars"
    write_jsonl(corpus, ASTRONOMY[:2])
    ws.index(SourceSpec("c", "jsonl", str(corpus)))
    leftovers = [p.name for p in (ws.root / "sources" / "c").iterdir() if p.name.startswith("build-")]
    assert leftovers == []


def test_links_that_lead_out_of_the_folder_are_skipped_and_reported_unless_allowed(ws, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "own.txt").write_text("Our notes about the vault rotation schedule.")
    (notes / "sub" / "also-own.txt").write_text("The rotation happens every Monday.")
    (notes / "linked-inside.txt").symlink_to(notes / "own.txt")  # a link that stays inside is fine
    (notes / "passwd.txt").symlink_to(outside / "passwd.txt")
    (notes / "elsewhere").symlink_to(outside, target_is_directory=True)
    report = ws.index(SourceSpec("notes", "files", str(notes)))
    assert report.ingest["skipped_links_outside"] == 1 and report.documents == 3
    hits = ws.source("notes", "bm25").search("root bin bash", 10)
    assert all("root:x" not in hit.text for hit in hits)
    allowed = ws.index(SourceSpec("notes-all", "files", str(notes), {"links_outside": True}))
    assert allowed.ingest["skipped_links_outside"] == 0 and allowed.documents == 4
    assert any("root:x" in hit.text for hit in ws.source("notes-all", "bm25").search("root bin bash", 10))


@pytest.mark.parametrize("line, problem", [
    (b'{"id": "caf\xe9", "text": "latin-1 bytes"}', "not UTF-8 text (byte 0xe9 at column 12)"),
    (b'{"id": "s", "text": "a lone \\ud800 escape"}', "lone surrogate"),
    (b'{"id": null, "text": "no id"}', "field 'id' is null"),
    (b'{"id": "  ", "text": "blank id"}', "field 'id' is blank"),
    (b'["not", "an", "object"]', "expected a JSON object, got list"),
    (b'{"id": "t", "text": 7}', "field 'text' is int"),
])
def test_each_bad_record_is_an_error_naming_file_and_line(ws, tmp_path, line, problem):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(ASTRONOMY[0]).encode() + b"\n" + line + b"\n")
    with pytest.raises(IngestError) as raised:
        ws.index(SourceSpec("bad", "jsonl", str(bad)))
    assert str(raised.value).startswith(f"{bad}:2: ") and problem in str(raised.value)
    assert ws.index(SourceSpec("bad", "jsonl", str(bad), {"skip_malformed": True})).ingest["skipped_malformed"] == 1


def test_beir_ids_long_records_binary_and_utf16_files(ws, tmp_path):
    beir = tmp_path / "beir"
    write_jsonl(beir / "corpus.jsonl", [{"_id": "b1", "title": "T", "text": "BEIR writes its ids as _id."}])
    assert ws.index(SourceSpec("beir", "beir", str(beir))).documents == 1
    assert ws.source("beir", "bm25").search("ids", 1)[0].doc_id == "b1"

    long_text = " ".join(f"word{i}" for i in range(5000))
    records = write_jsonl(tmp_path / "long.jsonl", [{"id": "long", "text": long_text}, ASTRONOMY[0]])
    report = ws.index(SourceSpec("long", "jsonl", str(records)))
    assert report.ingest["chunked_long_records"] == 1 and report.documents > 20
    hit = ws.source("long", "bm25").search("word4321", 1)[0]
    assert hit.doc_id.startswith("long#") and len(hit.text.split()) <= 200

    files = tmp_path / "files"
    files.mkdir()
    (files / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (files / "wide.txt").write_bytes("Unicode notes about the delta, saved as UTF-16.".encode("utf-16"))
    report = ws.index(SourceSpec("files", "files", str(files)))
    assert report.ingest["skipped_binary"] == 1 and report.documents == 1
    assert ws.source("files", "bm25").search("delta notes", 1)[0].text.startswith("Unicode notes")


def test_a_file_swapped_for_a_link_after_the_listing_is_never_read_from_outside(tmp_path):
    import threading
    import time

    from gradfuse.ingest.documents import IngestReport
    from gradfuse.ingest.files import read_files

    outside = tmp_path / "outside.txt"
    outside.write_text("TOP-SECRET outside the folder")
    notes = tmp_path / "notes"
    notes.mkdir()
    target, real, link = notes / "note.txt", tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("an ordinary note")
    link.symlink_to(outside)
    stop, leaked, runs = threading.Event(), 0, 0

    def swap():  # the file flips between a regular file and a link out of the folder, atomically each time
        staged = notes / ".staged.tmp"
        while not stop.is_set():
            for source in (real, link):
                if source.is_symlink():
                    staged.unlink(missing_ok=True)
                    staged.symlink_to(outside)
                else:
                    staged.write_text(source.read_text())
                staged.replace(target)
                time.sleep(0.0005)  # flips many times per read, without a busy loop taking a core from the reads

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        for _ in range(300):  # each read starts a parse worker (about 30 ms)
            report = IngestReport()
            try:
                documents = list(read_files(notes, report, words=200, overlap=40))
            except FileNotFoundError:
                continue  # caught between unlink and replace
            runs += 1
            leaked += sum("TOP-SECRET" in d.text for d in documents)
    finally:
        stop.set()
        swapper.join()
    assert runs > 150 and leaked == 0, (runs, leaked)


@pytest.fixture
def notes(tmp_path):
    """A folder the test fills; removed here, since pytest's own clean-up recurses and a 1,200-level tree
    exceeds Python's recursion limit."""
    folder = tmp_path / "notes"
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=True)


def test_odd_inputs_are_indexed_or_skipped_without_reading_them_whole(ws, tmp_path, notes):
    notes.mkdir()
    deep = notes
    for _ in range(1200):  # deeper than Python's recursion limit
        deep = deep / "d"
        deep.mkdir()
    (deep / "bottom.txt").write_text("The deepest note mentions the lighthouse keeper.")
    with open(notes / "sparse.txt", "wb") as handle:  # 1 GB of zeros that take no disk
        handle.truncate(1 << 30)
    (notes / "one-word.txt").write_text("x" * 200_000)
    report = ws.index(SourceSpec("odd", "files", str(notes)))
    assert report.ingest["skipped_binary"] == 1
    assert report.documents > 100  # the one 200,000-character word is cut into chunks, and the deep note kept
    hits = ws.source("odd", "bm25").search("lighthouse keeper", 1)
    assert hits and hits[0].doc_id.startswith("d/d/d/") and hits[0].doc_id.endswith("bottom.txt#0")
    records = write_jsonl(tmp_path / "records.jsonl", [{"id": "blob", "text": "A" * 100_000}])
    chunked = ws.index(SourceSpec("blobs", "jsonl", str(records)))
    assert chunked.ingest["chunked_long_records"] == 1 and chunked.documents > 1


def _open_on_deleted_files(folder) -> int:
    import os

    links = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
             if os.path.islink(f"/proc/self/fd/{fd}")]
    return sum(str(folder) in link and link.endswith("(deleted)") for link in links)


def test_replaced_versions_are_closed_when_their_last_request_ends(ws, tmp_path):
    corpus = write_jsonl(tmp_path / "notes.jsonl", ASTRONOMY)
    ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    source_dir = ws.root / "sources" / "notes"
    for round_ in range(6):  # publish, then search, as a long-running server sees rebuilds
        write_jsonl(corpus, ASTRONOMY + [{"id": f"extra-{round_}", "text": f"Extra note number {round_}."}])
        ws.index(SourceSpec("notes", "jsonl", str(corpus)))
        assert ws.search("moons of Mars", method="rrf", k=2).candidates
    assert _open_on_deleted_files(source_dir) == 0

    with ws.holding("notes", "bm25") as held:  # a request in flight across a publish keeps its version open
        write_jsonl(corpus, ASTRONOMY)
        ws.index(SourceSpec("notes", "jsonl", str(corpus)))
        assert ws.search("Phobos", method="rrf", retrieval="bm25", k=1).candidates[0].doc_id == "mars"
        assert held.search("Phobos", 1)[0].doc_id == "mars"
        assert _open_on_deleted_files(source_dir) > 0
    assert _open_on_deleted_files(source_dir) == 0


def test_a_reader_racing_publishes_always_finds_a_version(tmp_path):
    import threading

    from gradfuse.sources.base import publish_version

    source_dir = tmp_path / "source"
    (source_dir / "v-0").mkdir(parents=True)
    publish_version(source_dir, source_dir / "v-0")
    stop, missing = threading.Event(), 0

    def publish():
        number = 0
        while not stop.is_set():
            number += 1
            (source_dir / f"v-{number}").mkdir()
            publish_version(source_dir, source_dir / f"v-{number}")  # deletes the one before

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        for _ in range(5000):
            missing += current_version(source_dir) is None
    finally:
        stop.set()
        publisher.join()
    assert missing == 0


def test_a_failed_build_leaves_nothing_behind_and_a_build_is_private_to_its_owner(ws, tmp_path):
    import stat

    corpus = write_jsonl(tmp_path / "notes.jsonl", ASTRONOMY + [ASTRONOMY[0]])  # a duplicate id
    with pytest.raises(ValueError, match="duplicate document id"):
        ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    assert not list((ws.root / "sources" / "notes").glob("build-*"))
    write_jsonl(corpus, ASTRONOMY)
    ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    version = current_version(ws.root / "sources" / "notes")
    for path in [ws.root, ws.root / "sources", version, *version.rglob("*"), ws.root / "cache" / "embeddings.sqlite"]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path  # nothing readable by others


def test_run_files_with_unusable_ranks_or_scores_are_refused_by_line(ws, tmp_path):
    from gradfuse.sources.run import read_trec_run

    for line in ("q1 Q0 d1 1 nan tag", "q1 Q0 d1 1 inf tag", f"q1 Q0 d1 {10**30} 1.0 tag"):
        (tmp_path / "run.trec").write_text("q1 Q0 d0 1 2.0 tag\n" + line + "\n")
        with pytest.raises(IngestError, match="run.trec:2: the rank must be"):
            list(read_trec_run(tmp_path / "run.trec"))
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": "ok", "text": "fine"}\n' + "[" * 100_000 + "\n" + '{"id": ' + "9" * 5000 + ', "text": "x"}\n')
    report = ws.index(SourceSpec("deep", "jsonl", str(deep), {"skip_malformed": True}))
    assert report.documents == 1 and report.ingest["skipped_malformed"] == 2


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB file system of its own (tmpfs; needs root, as `make test` here runs)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_a_full_disk_is_one_clear_error_and_the_published_version_stays(small_disk, tmp_path):
    ws = Workspace(Config(workspace=small_disk / "ws"))
    corpus = write_jsonl(tmp_path / "notes.jsonl", ASTRONOMY)
    try:
        _fill_the_disk(ws, corpus, small_disk)
    finally:
        ws.close()


def _fill_the_disk(ws, corpus, small_disk):
    ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    published = current_version(small_disk / "ws" / "sources" / "notes")
    big = [{"id": f"log-{i}", "text": f"Entry {i}: " + " ".join(f"w{i}x{j}" for j in range(1200))} for i in range(300)]
    write_jsonl(corpus, big)
    with pytest.raises(IngestError, match="the disk is full") as raised:
        ws.index(SourceSpec("notes", "jsonl", str(corpus)))
    assert "\n" not in str(raised.value)
    assert current_version(small_disk / "ws" / "sources" / "notes") == published
    assert not list((small_disk / "ws" / "sources" / "notes").glob("build-*"))
    assert ws.search("Phobos", method="rrf", retrieval="bm25", k=1).candidates[0].doc_id == "mars"


def test_a_disk_that_fills_while_the_embedding_matrix_is_written_says_so_in_one_line(small_disk, tmp_path):
    """3,000 passages of three texts: the store, BM25 and the embedding cache fit in 2 MB, the matrix (4.6 MB) does
    not; numpy's short write has no errno, and was a traceback."""
    ws = Workspace(Config(workspace=small_disk / "ws"))
    corpus = write_jsonl(tmp_path / "many.jsonl", [{"id": f"r{n}", "text": f"Reading {n % 3} of the tide gauge."}
                                                   for n in range(3000)])
    try:
        with pytest.raises(IngestError, match="the disk is full") as raised:
            ws.index(SourceSpec("tides", "jsonl", str(corpus)))
        assert "\n" not in str(raised.value) and "requested" not in str(raised.value)
        assert not list((small_disk / "ws" / "sources" / "tides").glob("build-*"))
    finally:
        ws.close()


def _indexed_files(ws, source: str) -> set[str]:
    return {hit.doc_id.split("#")[0] for hit in ws.source(source, "bm25").search("the", 1000)}


def test_text_files_without_a_known_suffix_are_read_and_every_skipped_file_is_named(ws, tmp_path):
    """README, INSTALL and NEWS are what a user wants most (issue 71): a file whose name says no format is read
    as text where its bytes are text (UTF-8, or the encoding its first lines declare), and skipped by name and
    reason where they are not."""
    folder = tmp_path / "package"
    folder.mkdir()
    (folder / "README").write_text("The README explains how the lighthouse lamp is installed.\n")
    (folder / "INSTALL").write_text("To install the lamp, run the setup script as the keeper.\n")
    (folder / "NEWS").write_text("Version 2.1 of the lamp brightens the beam by ten percent.\n")
    (folder / "README.Debian").write_text("On Debian the lamp service starts at boot by default.\n")
    (folder / "notes.md").write_text("# Notes\n\nThe keeper checks the lamp every evening.\n")
    (folder / "legacy").write_bytes("# -*- coding: latin-1 -*-\nThe café by the lighthouse serves the keeper.\n"
                                    .encode("latin-1"))
    (folder / "lamp-daemon").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)  # a program
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64))
    (folder / "hexed").write_bytes(b"# coding: hex\n\xff\xfe the lamp")  # a codec of bytes, not of text
    (folder / "lamp.key").write_text("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n")
    (folder / "deploy").write_text("the lamp's key\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkt\n")
    for name in ("prod.env", "credentials.json", "terraform.tfstate", "id_ed25519"):
        (folder / name).write_text("the lamp token is s3cret\n")
    report = ws.index(SourceSpec("package", "files", str(folder)))
    assert _indexed_files(ws, "package") == {"README", "INSTALL", "NEWS", "README.Debian", "notes.md", "legacy"}
    assert report.formats == {"text": 5, "markdown": 1}
    assert {(name, reason) for name, reason, _ in report.skipped} == {
        ("lamp-daemon", "not text"), ("logo.png", "not text"), ("hexed", "not text"), ("lamp.key", "secret"),
        ("deploy", "secret"), ("prod.env", "secret"), ("credentials.json", "secret"), ("terraform.tfstate", "secret"),
        ("id_ed25519", "secret")}
    assert "café" in ws.source("package", "bm25").search("cafe keeper café", 1)[0].text
    assert not report.ingest["read_by_content"]  # text by its bytes is no surprise to report


def test_hidden_folders_tool_folders_and_gitignored_files_are_skipped_unless_asked(ws, tmp_path):
    folder = tmp_path / "repo"
    for path, text in {".git/config": "[core]\n\trepositoryformatversion = 0\n", ".git/description": "Unnamed",
                       ".venv/lib/site.txt": "site packages", ".env": "API_KEY=s3cret-value",
                       "node_modules/left-pad/README.md": "left pad", "notes.txt": "Our notes.",
                       ".gitignore": "build/\n*.log\n!keep.log\n", "build/out.txt": "built output",
                       "app.log": "a log line", "keep.log": "a log we keep", "sub/.gitignore": "draft.md\n",
                       "sub/draft.md": "a draft", "sub/final.md": "final text"}.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(f"{text}\nthe end\n")  # "the" finds every file (_indexed_files)
    report = ws.index(SourceSpec("repo", "files", str(folder)))
    assert _indexed_files(ws, "repo") == {"notes.txt", "keep.log", "sub/final.md"}
    assert {(name, reason) for name, reason, _ in report.skipped} == {
        (".git/", "hidden"), (".venv/", "hidden"), ("node_modules/", "hidden"), (".env", "hidden"),
        (".gitignore", "hidden"), ("sub/.gitignore", "hidden"), ("build/", "ignored"), ("app.log", "ignored"),
        ("sub/draft.md", "ignored")}
    assert not [hit for hit in ws.source("repo", "bm25").search("API_KEY s3cret", 10) if "s3cret" in hit.text]
    (folder / "docs" / "keep" / "deep").mkdir(parents=True)  # git's "keep only Markdown" idiom, and a bad line
    (folder / "docs" / ".gitignore").write_text("*\n!*/\n!*.md\n[z-a]\n# the end\n")
    (folder / "docs" / "keep" / "deep" / "page.md").write_text("a page\nthe end\n")
    (folder / "docs" / "keep" / "deep" / "draft.txt").write_text("a draft\nthe end\n")
    ws.index(SourceSpec("repo", "files", str(folder)))
    assert _indexed_files(ws, "repo") == {"notes.txt", "keep.log", "sub/final.md", "docs/keep/deep/page.md"}
    ws.index(SourceSpec("everything", "files", str(folder), {"hidden": True, "gitignore": False}))
    assert _indexed_files(ws, "everything") == {".git/config", ".git/description", ".venv/lib/site.txt",
                                                 "node_modules/left-pad/README.md", "notes.txt", ".gitignore",
                                                 "build/out.txt", "app.log", "keep.log", "sub/.gitignore",
                                                 "sub/draft.md", "sub/final.md", "docs/.gitignore",
                                                 "docs/keep/deep/page.md", "docs/keep/deep/draft.txt"}


def test_a_source_built_before_picks_up_text_files_and_drops_hidden_ones_at_its_next_sync(ws, tmp_path, monkeypatch):
    """What an upgrade changes reaches a source at its next sync, file by file: suffix-less text files are added,
    a hidden folder's files removed (the source is built here as an earlier version listed folders: hidden ones
    too, suffix-less files not)."""
    from gradfuse.indexing import folder_sync
    from gradfuse.ingest import files

    folder = tmp_path / "notes"
    (folder / ".hidden").mkdir(parents=True)
    (folder / ".hidden" / "secret.txt").write_text("the hidden plan")
    (folder / "plan.txt").write_text("the open plan")
    (folder / "TODO").write_text("the plan to do next")
    with monkeypatch.context() as earlier:
        earlier.setattr(folder_sync, "listing_options", lambda options: {"hidden": True, "gitignore": False})
        listed = files.list_files
        earlier.setattr(folder_sync, "list_files", lambda folder, report, **options: [
            f for f in listed(folder, report, **options) if "." in f.relative])
        ws.index(SourceSpec("notes", "files", str(folder)))
    assert _indexed_files(ws, "notes") == {".hidden/secret.txt", "plan.txt"}
    report = ws.index(SourceSpec("notes", "files", str(folder)))
    assert _indexed_files(ws, "notes") == {"TODO", "plan.txt"}
    assert (report.files["added"], report.files["deleted"], report.files["unchanged"]) == (1, 1, 1)
