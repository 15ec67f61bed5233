"""Rows of a table as chunks that each repeat the header row, so a numeric row is never retrieved without the
names of its columns (a Word table, a sheet, a CSV file)."""

from __future__ import annotations

from collections.abc import Iterable

from gradfuse.candidate import Location
from gradfuse.sources.readers import Unit

ROW_CHUNK_WORDS = 150  # a chunk's rows, header included, as far as they stay under this many words (one at least)


def row_text(cells: Iterable[object]) -> str:
    return " | ".join("" if cell is None else " ".join(str(cell).split()) for cell in cells)


def table_units(rows: Iterable[tuple[int, list[object]]], location: Location) -> list[Unit]:
    """`rows`: (the row's own number, its cells), the first non-empty one the header. Each unit's location
    carries the numbers of its first and last row."""
    header, units, chunk, words = None, [], [], 0
    for number, cells in rows:
        line = row_text(cells)
        if not line.replace("|", "").strip():
            continue
        if header is None:
            header = line
            continue
        size = len(line.split())
        if chunk and words + size > ROW_CHUNK_WORDS:
            units.append(_unit(header, chunk, location))
            chunk, words = [], len(header.split())
        if not chunk:
            words = len(header.split())
        chunk.append((number, line))
        words += size
    if chunk:
        units.append(_unit(header, chunk, location))
    elif header is not None:  # a header alone is still what the table says
        units.append(Unit(header, location, table=True))
    return units


def _unit(header: str, chunk: list[tuple[int, str]], location: Location) -> Unit:
    rows = (chunk[0][0], chunk[-1][0])
    text = "\n".join([header, *(line for _, line in chunk)])
    return Unit(text, Location(location.file, location.page, location.slide, location.sheet, rows,
                               location.headings), table=True)
