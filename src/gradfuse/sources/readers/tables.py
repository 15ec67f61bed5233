"""Rows of a table as chunks that each repeat the header row, so a numeric row is never retrieved without the
names of its columns (a Word table, a sheet, a CSV file)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from gradfuse.candidate import Location
from gradfuse.sources.readers import Unit

ROW_CHUNK_WORDS = 150  # a chunk's rows, header included, as far as they stay under this many words (one at least)


def row_text(cells: Iterable[object]) -> str:
    return " | ".join(_cell(cell) for cell in cells)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime) and value.time() == datetime.time():
        return value.date().isoformat()  # a date cell, as a person would type it (not "2003-09-19 00:00:00")
    return " ".join(str(value).split())


def table_units(rows: Iterable[tuple[int, list[object]]], location: Location) -> list[Unit]:
    """`rows`: (the row's own number, its cells), the first non-empty one the header. Each unit's location
    carries the numbers of its first and last row, and its lines after the header are those rows in order (an
    empty row inside a chunk is an empty line), so line i of a chunk is its sheet's row rows[0] + i - 1."""
    header, units, chunk, words = None, [], [], 0
    for number, cells in rows:
        line = row_text(cells)
        empty = not line.replace("|", "").strip()
        if header is None:
            if not empty:
                header, words = line, len(line.split())
            continue
        if empty:
            if chunk:
                chunk.append((number, ""))
            continue
        size = len(line.split())
        if chunk and words + size > ROW_CHUNK_WORDS:
            units.append(_unit(header, chunk, location))
            chunk, words = [], len(header.split())
        chunk.append((number, line))
        words += size
    if chunk:
        units.append(_unit(header, chunk, location))
    elif header is not None:  # a header alone is still what the table says
        units.append(Unit(header, location, table=True))
    return units


def _unit(header: str, chunk: list[tuple[int, str]], location: Location) -> Unit:
    while not chunk[-1][1]:  # empty rows at a chunk's end belong to no chunk
        chunk.pop()
    rows = (chunk[0][0], chunk[-1][0])
    text = "\n".join([header, *(line for _, line in chunk)])
    return Unit(text, Location(location.file, location.page, location.slide, location.sheet, rows,
                               location.headings), table=True)
