"""Spreadsheets (.xlsx through openpyxl, read-only and streamed) and CSV (the standard library): each sheet's
rows in chunks that repeat its header row, with the sheet's name and the rows' own numbers."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from gradfuse.candidate import Location
from gradfuse.ingest.readers import Parsed, Reading, Unreadable
from gradfuse.ingest.readers.tables import table_units


def read_xlsx(data: bytes, name: str, reading: Reading) -> Parsed:
    import openpyxl

    try:
        book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as error:  # openpyxl raises anything from KeyError to its own InvalidFileException
        raise Unreadable("corrupt", f"not a readable Excel file ({type(error).__name__}: {error})") from None
    limits = reading.limits
    try:
        counted, units = 0, []
        for sheet in book.worksheets:
            # The rows the sheet holds, not the ones its <dimension> claims: a 1.5 KB file declaring A1:XFD1000000
            # was padded to a million rows of 16,384 empty cells.
            sheet.reset_dimensions()

            def rows(sheet=sheet):
                nonlocal counted
                for number, cells in enumerate(sheet.iter_rows(values_only=True), start=1):
                    counted += 1
                    if counted > limits.max_rows:
                        raise Unreadable("too many rows", f"over {limits.max_rows} rows (--max-rows)")
                    yield number, cells

            units += table_units(rows(), Location(name, sheet=sheet.title), reading)
        return Parsed(units)
    finally:
        book.close()


def read_csv(data: bytes, name: str, reading: Reading) -> Parsed:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("cp1252", errors="replace")
    try:
        dialect = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    sheet, limits = Path(name).stem, reading.limits

    def rows():
        for number, cells in enumerate(csv.reader(io.StringIO(text, newline=""), dialect), start=1):
            if number > limits.max_rows:
                raise Unreadable("too many rows", f"over {limits.max_rows} rows (--max-rows)")
            yield number, cells

    try:
        return Parsed(table_units(rows(), Location(name, sheet=sheet), reading))
    except csv.Error as error:
        raise Unreadable("corrupt", f"not a readable CSV file ({error})") from None
