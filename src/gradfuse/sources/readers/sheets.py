"""Spreadsheets (.xlsx through openpyxl, read-only and streamed) and CSV (the standard library): each sheet's
rows in chunks that repeat its header row, with the sheet's name and the rows' own numbers."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from gradfuse.candidate import Location
from gradfuse.sources.readers import Parsed, ReaderLimits, Unreadable
from gradfuse.sources.readers.tables import table_units


def read_xlsx(data: bytes, name: str, limits: ReaderLimits) -> Parsed:
    import openpyxl

    try:
        book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as error:  # openpyxl raises anything from KeyError to its own InvalidFileException
        raise Unreadable("corrupt", f"not a readable Excel file ({type(error).__name__}: {error})") from None
    try:
        counted, units = 0, []
        for sheet in book.worksheets:
            def rows(sheet=sheet):
                nonlocal counted
                for number, cells in enumerate(sheet.iter_rows(values_only=True), start=1):
                    counted += 1
                    if counted > limits.max_rows:
                        raise Unreadable("too many rows", f"over {limits.max_rows} rows (--max-rows)")
                    yield number, list(cells)

            units += table_units(rows(), Location(name, sheet=sheet.title))
        return Parsed(units)
    finally:
        book.close()


def read_csv(data: bytes, name: str, limits: ReaderLimits) -> Parsed:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("cp1252", errors="replace")
    try:
        dialect = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    sheet = Path(name).stem

    def rows():
        for number, cells in enumerate(csv.reader(io.StringIO(text, newline=""), dialect), start=1):
            if number > limits.max_rows:
                raise Unreadable("too many rows", f"over {limits.max_rows} rows (--max-rows)")
            yield number, cells

    try:
        return Parsed(table_units(rows(), Location(name, sheet=sheet)))
    except csv.Error as error:
        raise Unreadable("corrupt", f"not a readable CSV file ({error})") from None
