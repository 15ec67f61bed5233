"""Word (.docx, python-docx): paragraphs in the order they stand, under their heading path (the "Heading n" and
"Title" styles), and each table as chunks of rows that repeat its header row. A merged cell is read once: python-
docx repeats it once per grid column it spans (`gridSpan = 3000` made a 100 KB cell 300 MB per row)."""

from __future__ import annotations

import io

from gradfuse.candidate import Location
from gradfuse.ingest.readers import Parsed, Reading, Unreadable
from gradfuse.ingest.readers.tables import table_units


def read_docx(data: bytes, name: str, reading: Reading) -> Parsed:
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table, _Cell

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, KeyError, ValueError) as error:
        raise Unreadable("corrupt", f"not a readable Word file ({error})") from None
    units, path_now, section = [], [], []

    def close_section() -> None:
        if section:
            units.append(reading.unit("\n".join(section), Location(name, headings=tuple(t for _, t in path_now))))
            section.clear()

    for block in document.iter_inner_content():
        if isinstance(block, Table):
            close_section()
            # each <w:tc> once; the lower part of a vertical merge ("continue") holds nothing of its own
            rows = ((number, (_Cell(tc, block).text if tc.vMerge != "continue" else "" for tc in row._tr.tc_lst))
                    for number, row in enumerate(block.rows, start=1))
            units += table_units(rows, Location(name, headings=tuple(t for _, t in path_now)), reading)
            continue
        text = block.text.strip()
        if not text:
            continue
        level = _heading_level(block.style.name if block.style is not None else "")
        if level is not None:
            close_section()
            path_now = [(outer, title) for outer, title in path_now if outer < level] + [(level, text)]
        section.append(text)
    close_section()
    return Parsed.joined(units)


def _heading_level(style: str) -> int | None:
    if style == "Title":
        return 0
    if style.startswith("Heading "):
        number = style.removeprefix("Heading ")
        return int(number) if number.isdigit() else None
    return None
