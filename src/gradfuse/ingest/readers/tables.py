"""Rows of a table as chunks that each repeat the header row, so a numeric row is never retrieved without the
names of its columns (a Word table, a sheet, a CSV file). A row keeps at most `max_columns` cells of at most
`max_cell_chars` characters, and the header each chunk repeats at most `max_header_chars`: a 116 KB CSV with a
16,000-column header otherwise became 2,000 chunks of the same 100 KB header. A chunk's rows also hold at least as
many characters as the header it repeats: a header of 126 one-letter columns over 57,874 rows of "1" made each row
a chunk of its own, and 116 KB an index of 131.6 MB."""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from gradfuse.candidate import Location
from gradfuse.ingest.readers import Reading, Unit

ROW_CHUNK_WORDS = 150  # a chunk's rows, header included, as far as they stay under this many words (one at least)
# Between a row's cells. A "|" inside a cell is written "\|": a cell "Widget | Pro" was read back as two cells,
# and every later value was quoted under the wrong column's name.
SEPARATOR = " | "


def row_text(cells: Iterable[object], reading: Reading, *, escaped: bool = True) -> str:
    """One row's cells, bounded; `escaped=False` for a table that is read as prose (a slide's), never split back."""
    limits, texts = reading.limits, []
    for number, cell in enumerate(cells):
        if number == limits.max_columns:
            reading.note(f"rows cut to {limits.max_columns} columns (--max-columns)")
            break
        text = reading.capped(_cell(cell), limits.max_cell_chars, "cells", "--max-cell-chars")
        texts.append(text.replace("|", r"\|") if escaped else text)
    return SEPARATOR.join(texts)


def row_cells(line: str) -> list[str]:
    """The cells of a row `row_text` wrote. A cell holds no bare "|" and no space at either end, so every " | "
    is a separator. (A row indexed before cells were escaped reads as it did: split at every " | ".)"""
    return [cell.replace(r"\|", "|") for cell in line.split(SEPARATOR)]


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime) and value.time() == datetime.time():
        return value.date().isoformat()  # a date cell, as a person would type it (not "2003-09-19 00:00:00")
    return " ".join(str(value).split())


def table_units(rows: Iterable[tuple[int, list[object]]], location: Location, reading: Reading) -> list[Unit]:
    """`rows`: (the row's own number, its cells), the first non-empty one the header. Each unit's location
    carries the numbers of its first and last row, and its lines after the header are those rows in order (an
    empty row inside a chunk is an empty line), so line i of a chunk is its sheet's row rows[0] + i - 1."""
    header, units, chunk, words, rows_chars = None, [], [], 0, 0
    for number, cells in rows:
        line = row_text(cells, reading)
        empty = not line.replace(SEPARATOR, "").strip()
        if header is None:
            if not empty:
                header = reading.capped(line, reading.limits.max_header_chars, "repeated header",
                                        "--max-header-chars")
                words = len(header.split())
            continue
        if empty:
            if chunk:
                chunk.append((number, ""))
            continue
        size = len(line.split())
        if chunk and words + size > ROW_CHUNK_WORDS and rows_chars >= len(header):
            units.append(_unit(header, chunk, location, reading))
            chunk, words, rows_chars = [], len(header.split()), 0
        chunk.append((number, line))
        words, rows_chars = words + size, rows_chars + len(line) + 1
    if chunk:
        units.append(_unit(header, chunk, location, reading))
    elif header is not None:  # a header alone is still what the table says
        units.append(reading.unit(header, location, table=True))
    return units


def _unit(header: str, chunk: list[tuple[int, str]], location: Location, reading: Reading) -> Unit:
    while not chunk[-1][1]:  # empty rows at a chunk's end belong to no chunk
        chunk.pop()
    rows = (chunk[0][0], chunk[-1][0])
    text = "\n".join([header, *(line for _, line in chunk)])
    return reading.unit(text, Location(location.file, location.page, location.slide, location.sheet, rows,
                                       location.headings), table=True)
