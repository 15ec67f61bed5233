"""The readers on real files written by real writers (fpdf2, python-docx, python-pptx, openpyxl, the csv module):
text and tables with the page, slide, sheet and rows, and heading path they come from; and the bad inputs a
folder of real documents holds (encrypted and corrupt PDFs, zip bombs, files too large or too long, lying
extensions, a parse past its deadline), each skipped with its reason while the rest is indexed."""

from __future__ import annotations

import csv
import shutil
import json
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradfuse import SourceSpec, Workspace
from gradfuse.cli import app
from gradfuse.config import Config
from gradfuse.reading.evidence import Evidence, row_spans
from gradfuse.schemas import search_record

docx = pytest.importorskip("docx")
openpyxl = pytest.importorskip("openpyxl")
fpdf = pytest.importorskip("fpdf")
pptx = pytest.importorskip("pptx")


def write_pdf(path: Path, pages: list[tuple[str, str]], *, blank_pages: int = 0, password: str | None = None) -> Path:
    """One page per (section title, text), the title an outline entry; then pages with no text at all."""
    pdf = fpdf.FPDF()
    if password:
        pdf.set_encryption(owner_password="owner", user_password=password)
    pdf.set_font("Helvetica", size=12)
    for title, text in pages:
        pdf.add_page()
        pdf.start_section(title, level=0)
        pdf.multi_cell(0, 8, text)
    for _ in range(blank_pages):
        pdf.add_page()
    pdf.output(str(path))
    return path


def write_docx(path: Path) -> Path:
    document = docx.Document()
    document.add_heading("Pump specification", 0)
    document.add_heading("1 Scope", 1)
    document.add_paragraph("The pump must start within three seconds of power on.")
    document.add_heading("1.1 Power", 2)
    document.add_paragraph("At idle the pump draws five watts.")
    table = document.add_table(rows=3, cols=2)
    for row, cells in zip(table.rows, [("Part", "Weight"), ("Impeller", "120 g"), ("Housing", "830 g")]):
        for cell, value in zip(row.cells, cells):
            cell.text = value
    document.add_heading("2 Maintenance", 1)
    document.add_paragraph("Replace the seals every eighteen months.")
    document.save(str(path))
    return path


def write_pptx(path: Path) -> Path:
    deck = pptx.Presentation()
    for title, body, notes in [("Roadmap 2027", "The beta ships in March.", "Mention the supplier delay."),
                               ("Budget", "Hardware costs rise by twelve percent.", "")]:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        if notes:
            slide.notes_slide.notes_text_frame.text = notes
    deck.save(str(path))
    return path


def write_xlsx(path: Path, rows: int = 120) -> Path:
    book = openpyxl.Workbook()
    sales = book.active
    sales.title = "Sales"
    sales.append(["Region", "Quarter", "Revenue (kEUR)"])
    for number in range(rows):
        sales.append([f"Region {number}", f"Q{number % 4 + 1}", 1000 + number])
    staff = book.create_sheet("Staff")
    staff.append(["Team", "Headcount"])
    staff.append(["Lighthouse keepers", 14])
    book.save(str(path))
    return path


def write_zip_bomb(path: Path, part: str) -> Path:
    """A zip with an Office part name whose one member unzips to 300 MB of zeros (300 KB on disk)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr(part, b"\0" * (300 * 1024 * 1024))
    return path


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("documents")
    write_pdf(folder / "report.pdf", [("1 Introduction", "This annual report covers the harbour authority."),
                                      ("2 Results", "Cargo volume grew by 7.5 percent to 41 million tonnes."),
                                      ("3 Outlook", "A new crane arrives in the spring.")], blank_pages=1)
    write_docx(folder / "spec.docx")
    write_pptx(folder / "deck.pptx")
    write_xlsx(folder / "figures.xlsx")
    with open(folder / "prices.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([["item", "price", "stock"], ["copper cable", "3.20", "40"],
                                      ["steel bolt", "0.15", "900"], ["Widget | Pro", "19.99", "12"]])
    (folder / "guide.md").write_text("# Guide\n\nIntro.\n\n## Install\n\nRun the installer as root.\n\n"
                                     "```\n# a comment, not a heading\n```\n\n## Use\n\nPress start.\n")
    (folder / "help.html").write_text(
        "<html><head><title>Router help</title></head><body><nav>Home | Shop | Contact | Login</nav><main>"
        "<h1>Router</h1><p>To reset the router, hold the button for ten seconds until the light blinks.</p>"
        "<h2>Warranty</h2><p>The warranty lasts two years from the date of purchase.</p></main>"
        "<footer>Copyright 2026 Example Networks. All rights reserved.</footer></body></html>")
    # Bad inputs, each skipped with its reason.
    write_pdf(folder / "locked.pdf", [("Secret", "Nothing to see.")], password="user")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> garbage")
    write_zip_bomb(folder / "bomb.docx", "word/document.xml")
    write_zip_bomb(folder / "bomb.xlsx", "xl/worksheets/sheet1.xml")
    (folder / "notes.docx").write_text("This is a plain text note saved with the wrong extension.")
    write_pdf(folder / "scan-named.txt", [("Minutes", "The board approved the dredging contract.")])
    return folder


@pytest.fixture(scope="module")
def indexed(documents, tmp_path_factory):
    ws = Workspace(Config(workspace=tmp_path_factory.mktemp("ws")))
    report = ws.index(SourceSpec("docs", "files", str(documents), {"max_unzipped_mb": 100}))
    return ws, report


def _search(ws, query: str, k: int = 3):
    return ws.search(query, method="single:docs", retrieval="bm25", k=k).candidates


def test_each_format_is_read_with_its_counts_and_every_bad_file_is_skipped_with_its_reason(indexed):
    _, report = indexed
    assert report.formats == {"csv": 1, "docx": 1, "html": 1, "markdown": 1, "pdf": 2, "pptx": 1, "text": 1,
                              "xlsx": 1}
    reasons = {name: reason for name, reason, _ in report.skipped}
    assert reasons == {"locked.pdf": "encrypted", "broken.pdf": "corrupt", "bomb.docx": "zip bomb",
                       "bomb.xlsx": "zip bomb"}
    assert report.skipped_by_reason == {"corrupt": 1, "encrypted": 1, "zip bomb": 2}
    assert report.ingest["pages_without_text"] == 1  # report.pdf's blank last page: counted, not silently lost
    assert report.ingest["read_by_content"] == 2  # the PDF named .txt, and the text named .docx


def test_pdf_pages_keep_their_page_number_and_outline_heading(indexed):
    ws, _ = indexed
    top = _search(ws, "cargo volume tonnes")[0]
    assert top.doc_id.startswith("report.pdf#") and "41 million tonnes" in top.text
    assert (top.location.page, top.location.headings) == (2, ("2 Results",))
    assert top.location.describe() == "report.pdf · p. 2 · 2 Results"
    assert top.parent_id == "report.pdf" and top.span is not None
    renamed = _search(ws, "dredging contract")[0]  # a PDF behind a .txt name is read as the PDF it is
    assert renamed.doc_id.startswith("scan-named.txt#") and renamed.location.page == 1


def test_word_paragraphs_keep_their_heading_path_and_tables_their_header(indexed):
    ws, _ = indexed
    power = _search(ws, "pump idle watts")[0]
    assert power.location.headings == ("Pump specification", "1 Scope", "1.1 Power")
    table = _search(ws, "impeller weight")[0]
    assert table.text.splitlines()[0] == "Part | Weight" and "Impeller | 120 g" in table.text
    assert table.location.headings == ("Pump specification", "1 Scope", "1.1 Power")
    seals = _search(ws, "replace seals")[0]
    assert seals.location.headings == ("Pump specification", "2 Maintenance")


def test_slides_are_units_with_their_title_and_notes(indexed):
    ws, _ = indexed
    roadmap = _search(ws, "supplier delay")[0]
    assert roadmap.location.slide == 1 and roadmap.location.headings == ("Roadmap 2027",)
    assert "The beta ships in March." in roadmap.text and "Notes: Mention the supplier delay." in roadmap.text
    assert roadmap.text.count("Roadmap 2027") == 1


def test_a_slides_table_is_prose_and_keeps_a_bar_in_a_cell_as_written(tmp_path):
    """A slide's table is read as text, never split back into cells, so its "|" is not escaped (review of round 5:
    "Basic \\| Pro" reached the index)."""
    from pptx.util import Inches

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Plans"
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(6), Inches(1)).table
    for (row, column), text in {(0, 0): "plan", (0, 1): "price", (1, 0): "Basic | Pro", (1, 1): "10"}.items():
        table.cell(row, column).text = text
    (tmp_path / "deck").mkdir()
    deck.save(str(tmp_path / "deck" / "plans.pptx"))
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("deck", "files", str(tmp_path / "deck")))
    found = ws.search("price of the Basic plan", method="concat", k=1).candidates[0]
    assert "plan | price\nBasic | Pro | 10" in found.text and "\\|" not in found.text


def test_spreadsheet_rows_come_in_chunks_that_repeat_the_header_with_sheet_and_rows(indexed):
    ws, _ = indexed
    row = _search(ws, '"Region 97"', k=1)[0]
    assert row.text.splitlines()[0] == "Region | Quarter | Revenue (kEUR)" and "Region 97 | Q2 | 1097" in row.text
    first, last = row.location.rows
    assert row.location.sheet == "Sales" and first <= 99 <= last  # Region 97 is the sheet's row 99
    staff = _search(ws, "lighthouse keepers headcount")[0]
    assert staff.location.describe() == "figures.xlsx · sheet Staff, row 2"
    price = _search(ws, "copper cable price")[0]
    assert price.text.startswith("item | price") and price.location.sheet == "prices"


def test_a_cell_holding_the_cell_separator_is_quoted_under_its_own_column(indexed):
    ws, _ = indexed
    chunk = _search(ws, "widget pro price")[0]
    row = next(span for span in row_spans(chunk.text) if "Widget" in chunk.text[span[0]:span[1]])
    assert Evidence.of(1, chunk, row, 1.0).quoted() == "item: Widget | Pro, price: 19.99, stock: 12"


def test_markdown_and_html_are_cut_along_headings_and_html_loses_its_boilerplate(indexed):
    ws, _ = indexed
    install = _search(ws, "installer root")[0]
    assert install.location.headings == ("Guide", "Install") and "# a comment" in install.text
    warranty = _search(ws, "warranty two years")[0]
    assert warranty.location.headings == ("Router", "Warranty") and warranty.title == "Router help"
    assert not _search(ws, "Copyright rights reserved Login Shop")  # navigation and footer are gone


def test_the_citation_json_and_the_cli_show_file_page_and_section(indexed, tmp_path):
    ws, _ = indexed
    record = search_record(ws.search("cargo volume tonnes", method="single:docs", retrieval="bm25", k=1))
    location = record.candidates[0].location
    assert location.cited_as == "report.pdf · p. 2 · 2 Results" and location.page == 2
    shown = CliRunner().invoke(app, ["search", "cargo volume tonnes", "--method", "single:docs", "--retrieval",
                                     "bm25", "--workspace", str(ws.root), "--json"])
    assert json.loads(shown.output)["candidates"][0]["location"]["cited_as"] == "report.pdf · p. 2 · 2 Results"


def test_index_files_prints_counts_per_format_and_per_reason(documents, tmp_path):
    shown = CliRunner().invoke(app, ["index", "files", str(documents), "--source", "mixed", "--max-unzipped-mb",
                                     "100", "--workspace", str(tmp_path / "ws")], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "read: 1 csv, 1 docx, 1 html, 1 markdown, 2 pdf, 1 pptx, 1 text, 1 xlsx" in shown.output
    assert "skipped 4 file(s): 1 corrupt, 1 encrypted, 2 zip bomb" in shown.output
    assert "locked.pdf: encrypted" in shown.output and "bomb.xlsx: zip bomb" in shown.output


def test_limits_on_size_pages_and_time_skip_only_the_file_at_fault(tmp_path):
    folder = tmp_path / "limits"
    folder.mkdir()
    write_pdf(folder / "long.pdf", [(f"Part {i}", f"Page {i} of the long manual.") for i in range(12)])
    write_pdf(folder / "huge.pdf", [(f"Chapter {i}", "Every page repeats this sentence about gears. " * 20)
                                    for i in range(500)])
    write_xlsx(folder / "big.xlsx", rows=3000)
    (folder / "large.csv").write_text("id,note\n" + "".join(f"{i},a row of a large table\n" for i in range(60_000)))
    (folder / "keep.md").write_text("# Kept\n\nThis note survives every limit.")
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    report = ws.index(SourceSpec("limited", "files", str(folder), {"max_pages": 100, "max_rows": 1000,
                                                                    "max_file_mb": 1}))
    reasons = {name: reason for name, reason, _ in report.skipped}
    assert reasons == {"huge.pdf": "too many pages", "big.xlsx": "too many rows", "large.csv": "too large"}
    assert report.formats == {"markdown": 1, "pdf": 1} and _search_in(ws, "limited", "long manual")
    (folder / "big.xlsx").unlink()
    (folder / "large.csv").unlink()
    # 500 pages take about 0.2 s to parse here, 12 pages 2 ms (the worker's start is not counted)
    timed = ws.index(SourceSpec("timed", "files", str(folder), {"deadline_s": 0.05}))
    assert {name: reason for name, reason, _ in timed.skipped} == {"huge.pdf": "deadline"}
    assert timed.formats == {"markdown": 1, "pdf": 1} and _search_in(ws, "timed", "note survives")
    assert _search_in(ws, "timed", "long manual")[0].location.page is not None  # the worker after the kill


def _search_in(ws, source: str, query: str):
    return ws.search(query, method=f"single:{source}", retrieval="bm25", k=1).candidates


def test_a_reindex_parses_only_the_files_that_changed(tmp_path):
    folder = tmp_path / "changing"
    folder.mkdir()
    write_docx(folder / "spec.docx")
    write_pptx(folder / "deck.pptx")
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("changing", "files", str(folder)))
    cache = tmp_path / "ws" / "cache" / "parsed" / "changing"
    entries = {path.name: path for path in cache.glob("*.json")}
    assert len(entries) == 2
    # Mark the deck's stored parse: a deck read again would come from that entry, and say May.
    deck_entry = next(path for path in entries.values() if "Roadmap" in path.read_text())
    deck_entry.write_text(deck_entry.read_text().replace("The beta ships in March.", "The beta ships in May."))
    document = docx.Document(str(folder / "spec.docx"))
    document.add_paragraph("Lubricate the bearings every week.")
    document.save(str(folder / "spec.docx"))
    rebuilt = ws.index(SourceSpec("changing", "files", str(folder)))
    # the changed file parsed anew, its old parse removed with the build
    assert rebuilt.status == "built" and len(list(cache.glob("*.json"))) == 2 and deck_entry.exists()
    assert _search_in(ws, "changing", "lubricate bearings")[0].doc_id.startswith("spec.docx#")
    # the deck was not read at all: its passages are the published version's (a sync reads changed files only),
    # and its parse stays cached for a build that writes the source whole
    assert "ships in March" in _search_in(ws, "changing", "beta ships")[0].text and deck_entry.exists()


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="no Tesseract here (make test installs Debian's "
                                                                "tesseract-ocr where it can)")
def test_a_scanned_page_is_counted_or_read_by_ocr_when_asked(tmp_path):
    from PIL import Image, ImageDraw, ImageFont

    scan = Image.new("L", (1700, 2200), 255)  # a letter page at 200 dpi, its text only pixels
    ImageDraw.Draw(scan).text((150, 300), "The lighthouse keeper counted\nforty two ships in the harbour.",
                              fill=0, font=ImageFont.load_default(size=64))
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.image(scan, x=0, y=0, w=pdf.w, h=pdf.h)
    folder = tmp_path / "scans"
    folder.mkdir()
    pdf.output(str(folder / "scan.pdf"))
    (folder / "note.md").write_text("# Note\n\nA note with a text layer of its own.")
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    plain = ws.index(SourceSpec("plain", "files", str(folder)))
    assert plain.ingest["pages_without_text"] == 1 and plain.ingest["pages_read_by_ocr"] == 0
    read = ws.index(SourceSpec("read", "files", str(folder), {"ocr": True}))
    assert read.ingest["pages_without_text"] == 0 and read.ingest["pages_read_by_ocr"] == 1
    found = _search_in(ws, "read", "lighthouse keeper ships")[0]
    assert found.location.describe() == "scan.pdf · p. 1" and "harbour" in found.text.lower()
