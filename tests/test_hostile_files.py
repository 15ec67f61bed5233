"""Round 4 of hostile inputs: small files that multiply their text, take memory, or take the time of a process
that should not be running them. Each is a real file read by the real worker (and, where it matters, the real CLI
in a process of its own); the rule is that what a file costs is bounded by limits the user can see."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.sources.base import current_version
from gradfuse.ingest.documents import IngestReport, chunk_text
from gradfuse.ingest.files import read_files
from gradfuse.ingest.readers import ReaderLimits
from gradfuse.ingest.readers.isolation import ParserWorker, _receive, _TooLong

docx = pytest.importorskip("docx")
openpyxl = pytest.importorskip("openpyxl")
fpdf = pytest.importorskip("fpdf")

GRADFUSE = Path(sys.executable).with_name("gradfuse")


def _index(tmp_path: Path, folder: Path, **options):
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    return ws, ws.index(SourceSpec("hostile", "files", str(folder), options))


def _texts(ws) -> list[str]:
    """The chunks the build stored."""
    with sqlite3.connect(current_version(ws.root / "sources" / "hostile") / "docs.sqlite") as db:
        return [text for (text,) in db.execute("SELECT text FROM docs")]


def _folder(tmp_path: Path, name: str = "folder") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "keep.md").write_text("# Kept\n\nThe pump must start within three seconds.")
    return folder


# --- files whose text multiplies -------------------------------------------------------------------------------

def test_a_csv_with_a_16000_column_header_is_cut_not_repeated_in_full(tmp_path):
    folder = _folder(tmp_path)
    header = ",".join(f"column{i}" for i in range(16_000))  # about 140 KB, repeated by every chunk before
    (folder / "wide.csv").write_text(header + "\n" + "".join(f"{i}\n" for i in range(2000)))
    ws, report = _index(tmp_path, folder)
    chunks = [text for text in _texts(ws) if text.startswith("column0")]
    assert chunks and max(len(text.split("\n")[0]) for text in chunks) <= ReaderLimits.max_header_chars
    assert len(chunks) < 100 and sum(map(len, chunks)) < 100_000  # 2,000 copies of the header were 280 MB
    assert any("--max-header-chars" in cut and "--max-columns" not in cut for cut in report.cut)
    assert any("--max-columns" in cut for cut in report.cut)


def test_a_csv_whose_wide_header_outweighs_its_rows_is_not_repeated_for_every_row(tmp_path):
    """Round 5, H2: 126 one-letter columns (a header of 250 words, over a chunk's 150) and 57,874 rows of "1": each
    row became a chunk of its own repeating the header, and 116 KB of CSV an index of 131.6 MB."""
    folder = _folder(tmp_path)
    header = ",".join(chr(ord("a") + i % 26) for i in range(126))
    (folder / "wide.csv").write_text(header + "\n" + "1\n" * 57_874)
    size = (folder / "wide.csv").stat().st_size
    ws, report = _index(tmp_path, folder)
    chunks = [text for text in _texts(ws) if text.startswith("a | b")]
    assert sum(text.count("\n1") for text in chunks) == 57_874  # every row is still there, under its header
    assert len(chunks) < 500 and sum(map(len, chunks)) < 3 * size
    index = sum(f.stat().st_size for f in (ws.root / "sources" / "hostile").rglob("*") if f.is_file())
    assert index < 20 * size, f"{index:,} bytes of index for {size:,} bytes of CSV"


def test_an_xlsx_whose_header_cells_share_one_long_string_stays_small(tmp_path):
    folder = _folder(tmp_path)
    book = openpyxl.Workbook()
    sheet = book.active
    long_string = "pressure " * 14_000  # 126 KB, stored once, referenced by 200 cells
    sheet.append([long_string] * 200)
    for row in range(20):
        sheet.append([f"reading {row}"] + [row] * 5)
    book.save(folder / "shared.xlsx")
    assert (folder / "shared.xlsx").stat().st_size < 100_000
    ws, report = _index(tmp_path, folder)
    assert report.formats.get("xlsx") == 1, report.skipped
    assert sum(map(len, _texts(ws))) < 1_000_000  # it parsed to 1.29 GB of text
    assert any("--max-cell-chars" in cut for cut in report.cut)


def test_a_word_cell_spanning_3000_columns_is_read_once(tmp_path):
    folder = _folder(tmp_path)
    document = docx.Document()
    table = document.add_table(rows=20, cols=1)
    for number, row in enumerate(table.rows):
        cell = row.cells[0]
        cell.text = f"row {number} " + "flange " * 15_000  # 100 KB
        cell._tc.get_or_add_tcPr().grid_span = 3000  # noqa: SLF001 - the merge Word writes
    document.save(folder / "merged.docx")
    ws, report = _index(tmp_path, folder)
    assert report.formats.get("docx") == 1, report.skipped
    texts = [text for text in _texts(ws) if "flange" in text]
    assert texts and all(text.count("row ") <= 2 for text in texts)  # header and one row, each cell once
    assert sum(map(len, texts)) < 200_000


def test_text_produced_over_the_budget_skips_the_file_with_its_limit(tmp_path):
    folder = _folder(tmp_path)
    (folder / "book.txt").write_text("word " * 400_000)  # 2 MB of text
    _, report = _index(tmp_path, folder, max_text_mb=1)
    assert {name: reason for name, reason, _ in report.skipped} == {"book.txt": "too much text"}
    assert "--max-text-mb" in report.skipped[0][2] and report.formats == {"markdown": 1}


# --- the worker's memory, reply and CPU -------------------------------------------------------------------------

def nested_pdf(path: Path, depth: int, fanout: int = 10, page: tuple[int, int] = (612, 792)) -> Path:
    """One page drawing a form XObject that draws the next level `fanout` times, each shifted, `depth` levels:
    fanout ** (depth - 1) text draws from a file of about 3 KB."""
    objects = {1: "<< /Type /Catalog /Pages 2 0 R >>", 2: "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               3: f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {page[0]} {page[1]}] /Contents 5 0 R "
                  "/Resources << /Font << /F1 4 0 R >> /XObject << /X 10 0 R >> >> >>",
               4: "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"}
    streams = {5: ("<<", "/X Do")}
    for level in range(depth):
        last = level == depth - 1
        body = ("BT /F1 12 Tf 72 72 Td (gear) Tj ET" if last else
                " ".join(f"q 1 0 0 1 {i * 0.5:g} {i * 7:g} cm /X Do Q" for i in range(fanout)))
        resources = "<< /Font << /F1 4 0 R >> >>" if last else \
            f"<< /XObject << /X {11 + level} 0 R >> /Font << /F1 4 0 R >> >>"
        streams[10 + level] = (f"<< /Type /XObject /Subtype /Form /BBox [0 0 {page[0]} {page[1]}] "
                               f"/Resources {resources}", body)
    out, offsets = bytearray(b"%PDF-1.7\n"), {}
    for number in sorted({*objects, *streams}):
        offsets[number] = len(out)
        if number in streams:
            head, body = streams[number]
            out += f"{number} 0 obj\n{head} /Length {len(body)} >>\nstream\n{body}\nendstream\nendobj\n".encode()
        else:
            out += f"{number} 0 obj\n{objects[number]}\nendobj\n".encode()
    size, xref = max(offsets) + 1, len(out)
    out += f"xref\n0 {size}\n0000000000 65535 f \n".encode()
    out += b"".join((f"{offsets[n]:010d} 00000 n \n" if n in offsets else "0000000000 65535 f \n").encode()
                    for n in range(1, size))
    out += f"trailer\n<< /Size {size} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path


def test_nested_pdf_forms_stay_inside_the_workers_memory_and_text_limits(tmp_path):
    """10^6 text draws from 2.4 KB took 5 GB. In a process of its own, so that the worker's peak memory is the
    only child measured: the file is skipped by a limit, the worker never held much more than its limit."""
    pdf = nested_pdf(tmp_path / "nested.pdf", depth=7)
    assert pdf.stat().st_size < 4000
    script = textwrap.dedent(f"""
        import json, resource
        from gradfuse.ingest.readers import ReaderLimits, Unreadable
        from gradfuse.ingest.readers.isolation import ParserWorker
        data = open({str(pdf)!r}, "rb").read()
        with ParserWorker() as worker:
            try:
                worker.parse(data, ".pdf", "nested.pdf", ReaderLimits(max_worker_mb=1024, deadline_s=120))
                outcome = "read"
            except Unreadable as error:
                outcome = error.reason
        print(json.dumps([outcome, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))
    """)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    outcome, peak_kb = json.loads(ran.stdout.strip().splitlines()[-1])
    assert outcome in ("too much memory", "corrupt", "too much text"), outcome
    assert peak_kb < 1200 * 1024


def test_a_reply_longer_than_a_files_budget_is_refused_unread():
    import io
    import struct

    forged = io.BytesIO(struct.pack(">Q", 2**62) + b"x" * 10)  # a length no parse of the limits could reach
    with pytest.raises(_TooLong):
        _receive(forged, limit=1000)
    assert forged.tell() == 8  # nothing read beyond the length


@pytest.mark.skipif(subprocess.run(["which", "tesseract"], capture_output=True).returncode != 0,
                    reason="no Tesseract here")
def test_ocr_renders_a_huge_page_below_its_pixel_limit(tmp_path):
    folder = _folder(tmp_path)
    pdf = fpdf.FPDF(unit="pt", format=(14_400, 14_400))  # the largest page a PDF allows: 3.4 GB at 300 dpi
    pdf.add_page()
    pdf.output(str(folder / "poster.pdf"))
    _, report = _index(tmp_path, folder, ocr=True, max_ocr_megapixels=4)
    assert report.ingest["pages_read_by_ocr"] == 1 and report.ingest["pages_without_text"] == 1
    assert any("--max-ocr-megapixels" in cut for cut in report.cut)


# --- the worker's isolation ---------------------------------------------------------------------------------------

def _write_docx(path: Path, text: str) -> Path:
    document = docx.Document()
    document.add_paragraph(text)
    document.save(path)
    return path


def test_a_docx_py_in_the_current_folder_does_not_run_and_the_worker_gets_no_keys(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    marker = tmp_path / "imported"
    (folder / "docx.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    _write_docx(folder / "spec.docx", "The valve closes at four bar.")
    env = {**os.environ, "OPENAI_API_KEY": "sk-never-in-the-worker"}
    ran = subprocess.run([str(GRADFUSE), "index", "files", ".", "--source", "shared", "--workspace",
                          str(tmp_path / "ws")], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 docx" in ran.stdout and not marker.exists()

    os.environ["GRADFUSE_TEST_SECRET"] = "never-in-the-worker"
    try:
        with ParserWorker() as worker:
            kind, parsed = worker.parse(b"# Title\n\ntext", ".md", "a.md", ReaderLimits())
            environment = Path(f"/proc/{worker.pid}/environ").read_bytes()
            assert os.readlink(f"/proc/{worker.pid}/cwd") == "/"
    finally:
        del os.environ["GRADFUSE_TEST_SECRET"]
    assert kind == "markdown" and parsed.title == "Title"
    assert b"GRADFUSE_TEST_SECRET" not in environment and b"OPENAI_API_KEY" not in environment


def raw_xlsx(path: Path, rows: str, dimension: str = "A1") -> Path:
    """A workbook written part by part: one sheet with `rows` (<row> elements) and the <dimension> it claims."""
    main = "http://schemas.openxmlformats.org"
    relationship = f"{main}/officeDocument/2006/relationships"
    parts = {
        "[Content_Types].xml": f'<Types xmlns="{main}/package/2006/content-types"><Default Extension="rels" '
                               'ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                               '<Default Extension="xml" ContentType="application/xml"/><Override '
                               'PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-'
                               'officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/'
                               'sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.'
                               'spreadsheetml.worksheet+xml"/></Types>',
        "_rels/.rels": f'<Relationships xmlns="{main}/package/2006/relationships"><Relationship Id="rId1" '
                       f'Type="{relationship}/officeDocument" Target="xl/workbook.xml"/></Relationships>',
        "xl/workbook.xml": f'<workbook xmlns="{main}/spreadsheetml/2006/main" xmlns:r="{relationship}"><sheets>'
                           '<sheet name="Data" sheetId="1" r:id="rId1"/></sheets></workbook>',
        "xl/_rels/workbook.xml.rels": f'<Relationships xmlns="{main}/package/2006/relationships"><Relationship '
                                      f'Id="rId1" Type="{relationship}/worksheet" Target="worksheets/sheet1.xml"/>'
                                      '</Relationships>',
        "xl/worksheets/sheet1.xml": f'<worksheet xmlns="{main}/spreadsheetml/2006/main"><dimension '
                                    f'ref="{dimension}"/><sheetData>{rows}</sheetData></worksheet>',
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in parts.items():
            archive.writestr(name, text)
    return path


def _row(number: int, *cells: str) -> str:
    return f'<row r="{number}">' + "".join(f'<c r="{chr(65 + i)}{number}" t="inlineStr"><is><t>{text}</t></is></c>'
                                          for i, text in enumerate(cells)) + "</row>"


def test_a_sheet_that_claims_a_million_rows_of_16384_columns_is_read_as_what_it_holds(tmp_path):
    folder = _folder(tmp_path)
    raw_xlsx(folder / "claims.xlsx", _row(1, "Part", "Weight") + _row(2, "impeller", "120 g"), "A1:XFD1000000")
    assert (folder / "claims.xlsx").stat().st_size < 2000
    ws, report = _index(tmp_path, folder, deadline_s=30.0)  # it ran for over 70 s before
    assert report.formats == {"markdown": 1, "xlsx": 1} and not report.skipped
    assert any("impeller | 120 g" in text for text in _texts(ws))


def test_the_worker_dies_with_its_parent(tmp_path):
    """kill -9 of the process that indexes: its worker, busy with a large sheet, goes with it."""
    sheet = raw_xlsx(tmp_path / "large.xlsx", "".join(_row(i, f"item {i}", str(i)) for i in range(1, 600_001)))
    script = textwrap.dedent(f"""
        import sys
        from gradfuse.ingest.readers import ReaderLimits
        from gradfuse.ingest.readers.isolation import ParserWorker
        worker = ParserWorker()
        worker.parse(b"warm", ".txt", "warm.txt", ReaderLimits())
        print(worker.pid, flush=True)
        worker.parse(open({str(sheet)!r}, "rb").read(), ".xlsx", "large.xlsx", ReaderLimits(deadline_s=600))
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    time.sleep(1.0)  # the sheet is being parsed (it takes many seconds)
    assert _alive(worker)
    parent.kill()
    parent.wait()
    for _ in range(50):
        if not _alive(worker):
            break
        time.sleep(0.1)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# --- formats that ran in the main process -----------------------------------------------------------------------

def test_a_markdown_heading_line_of_spaces_parses_in_linear_time_and_is_not_repeated(tmp_path):
    folder = _folder(tmp_path)
    (folder / "spaces.md").write_text("# a" + " " * 300_000 + "b\n\nbody text\n")  # about 3 hours before
    ws, report = _index(tmp_path, folder, deadline_s=30.0)
    assert report.formats == {"markdown": 2} and not report.skipped
    # its title and heading are cut where every chunk repeats them, and the spaces make no chunks (95 MB before)
    with sqlite3.connect(current_version(ws.root / "sources" / "hostile") / "docs.sqlite") as db:
        rows = db.execute("SELECT * FROM docs").fetchall()
    assert len(rows) < 10 and sum(len(str(value)) for row in rows for value in row) < 20_000
    assert any("--max-header-chars" in cut for cut in report.cut)


def test_html_is_parsed_under_the_workers_deadline(tmp_path):
    folder = _folder(tmp_path)
    attributes = " ".join(f'a{i}="{i}"' for i in range(200_000))
    (folder / "tag.html").write_text(f"<html><body><p {attributes}>hello</p></body></html>")
    _, report = _index(tmp_path, folder, deadline_s=2.0)
    assert {name: reason for name, reason, _ in report.skipped} == {"tag.html": "deadline"}
    assert report.formats == {"markdown": 1}


def test_an_office_zip_with_too_many_entries_is_skipped_before_its_directory_is_read(tmp_path):
    folder = _folder(tmp_path)
    with zipfile.ZipFile(folder / "parts.docx", "w") as archive:
        archive.writestr("word/document.xml", "<w:document/>")
        for number in range(3000):
            archive.writestr(f"word/media/{number}.bin", b"")
    _, report = _index(tmp_path, folder, max_zip_entries=1000)
    assert {name: reason for name, reason, _ in report.skipped} == {"parts.docx": "too many parts"}
    assert "--max-zip-entries" in report.skipped[0][2]


def _reference_chunks(text: str, words: int, overlap: int) -> list[tuple[int, int]]:
    """Windows over the list of every word's bounds: what chunk_text computed before it streamed."""
    import re

    from gradfuse.ingest.documents import CHARS_PER_WORD, _by_characters

    bounds = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    spans, step = [], words - overlap
    for first in range(0, len(bounds), step):
        last = min(first + words, len(bounds)) - 1
        spans += _by_characters(bounds[first][0], bounds[last][1], words * CHARS_PER_WORD, overlap * CHARS_PER_WORD)
        if last == len(bounds) - 1:
            break
    return spans


def test_chunking_streams_the_text_with_the_same_windows():
    import random

    generator = random.Random(7)
    for _ in range(200):
        words = generator.randint(2, 12)
        overlap = generator.randint(0, words - 1)
        text = " ".join("x" * generator.randint(1, 40) for _ in range(generator.randint(0, 60)))
        assert list(chunk_text(text, words=words, overlap=overlap)) == _reference_chunks(text, words, overlap)
    text = "word " * 1_000_000  # 5 MB: a list of every word's bounds took about 100 MB
    tracemalloc.start()
    try:
        for _ in chunk_text(text, words=200, overlap=40):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000


# --- the parse cache ----------------------------------------------------------------------------------------------

def test_the_parse_cache_is_private_from_its_first_write_pruned_and_robust(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    _write_docx(folder / "payroll.docx", "Alice earns 7,300 a month.")
    _write_docx(folder / "memo.docx", "The canteen closes early on Friday.")
    cache = tmp_path / "cache" / "src"

    def read() -> list:
        return list(read_files(folder, IngestReport(), words=50, overlap=10, cache=cache))

    assert len(read()) == 2
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    entries = list(cache.iterdir())
    assert len(entries) == 2 and all(stat.S_IMODE(e.stat().st_mode) == 0o600 for e in entries)
    (folder / "payroll.docx").unlink()  # a document that leaves the folder leaves the cache
    assert len(read()) == 1
    assert [e for e in cache.iterdir()] and not any("Alice" in e.read_text() for e in cache.iterdir())
    entry = next(cache.iterdir())
    entry.write_text('{"kind": "docx", "parsed": {"te')  # a build killed mid-write, an older version
    documents = read()
    assert [d.text for d in documents] == ["The canteen closes early on Friday."]
    assert json.loads(entry.read_text())["kind"] == "docx" and not list(cache.glob("*.tmp"))


def test_every_file_skipped_says_why(tmp_path):
    folder = tmp_path / "slow"
    folder.mkdir()
    (folder / "tag.html").write_text("<html><body><p " + " ".join(f'a{i}="{i}"' for i in range(200_000))
                                     + ">hello</p></body></html>")
    ran = subprocess.run([str(GRADFUSE), "index", "files", str(folder), "--source", "slow", "--deadline-s", "1",
                          "--workspace", str(tmp_path / "ws")], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 2
    assert "holds no documents" in ran.stdout and "tag.html: deadline" in ran.stdout, ran.stdout


def test_openpyxl_parses_with_defusedxml_which_gradfuse_declares():
    from importlib.metadata import requires

    from openpyxl.xml import DEFUSEDXML

    assert DEFUSEDXML and any(r.startswith("defusedxml") for r in requires("gradfuse"))


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KB tmpfs: a disk that fills (mounting needs root; elsewhere the test says it is skipped)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_while_caching_a_parse_is_one_clear_error_and_leaves_no_temporary_file(tmp_path, tiny_disk):
    from gradfuse.ingest.documents import IngestError

    folder = tmp_path / "docs"
    folder.mkdir()
    _write_docx(folder / "long.docx", "The turbine blade inspection found no cracks. " * 3000)  # 140 KB of text
    with pytest.raises(IngestError, match="the disk is full") as raised:
        list(read_files(folder, IngestReport(), words=50, overlap=10, cache=tiny_disk / "parsed"))
    assert "Traceback" not in str(raised.value) and not list((tiny_disk / "parsed").iterdir())


# --- found by an independent review of the limits above -----------------------------------------------------------

def test_three_hundred_nested_word_headings_are_not_repeated_in_every_chunk(tmp_path):
    """Any style named "Heading N" is a level: each chunk carried the whole path (a 52 KB file, 252 MB)."""
    from docx.enum.style import WD_STYLE_TYPE

    folder = _folder(tmp_path)
    document = docx.Document()
    for level in range(1, 301):
        if f"Heading {level}" not in [style.name for style in document.styles]:
            document.styles.add_style(f"Heading {level}", WD_STYLE_TYPE.PARAGRAPH)
        document.add_paragraph(f"Level {level} " + "deep " * 100, style=f"Heading {level}")
    document.save(folder / "deep.docx")
    ws, report = _index(tmp_path, folder)
    assert report.formats.get("docx") == 1, report.skipped
    with sqlite3.connect(current_version(ws.root / "sources" / "hostile") / "docs.sqlite") as db:
        places = [len(location) for (location,) in db.execute("SELECT location FROM docs WHERE location IS NOT NULL")]
    assert max(places) < 2 * ReaderLimits.max_header_chars and sum(places) < 1_000_000
    assert any("heading paths" in cut for cut in report.cut)


def test_a_file_of_empty_sections_is_skipped_for_its_chunks(tmp_path):
    folder = _folder(tmp_path)
    (folder / "sections.md").write_text("# a\n" * 200_000)  # 800 KB: 200,000 chunks to embed
    _, report = _index(tmp_path, folder)
    assert {name: reason for name, reason, _ in report.skipped} == {"sections.md": "too many chunks"}
    assert "--max-chunks" in report.skipped[0][2] and report.formats == {"markdown": 1}


def test_a_file_the_system_will_not_read_is_skipped_and_the_rest_is_read(tmp_path):
    folder = _folder(tmp_path)
    (folder / "mem.txt").symlink_to("/proc/self/mem")  # opens, then every read fails (EIO)
    _, report = _index(tmp_path, folder, links_outside=True)
    assert {name: reason for name, reason, _ in report.skipped} == {"mem.txt": "unreadable"}
    assert report.formats == {"markdown": 1}


def test_many_code_fences_do_not_make_heading_detection_quadratic(tmp_path):
    folder = _folder(tmp_path)
    (folder / "fences.md").write_text("```\n```\n# h\n" * 40_000)  # took about 66 s of worker CPU
    _, report = _index(tmp_path, folder, deadline_s=20.0)
    assert not report.skipped and report.formats == {"markdown": 2}


def test_the_parse_cache_keeps_text_once_and_as_utf8(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    _write_docx(folder / "emoji.docx", "🙂" * 200_000)
    cache = tmp_path / "cache"
    list(read_files(folder, IngestReport(), words=50, overlap=10, cache=cache))
    entry = next(cache.iterdir())
    assert entry.stat().st_size < 4.2 * 200_000  # 4 bytes a character, once (24 bytes a character before)
    assert "text" not in json.loads(entry.read_text())["parsed"]
