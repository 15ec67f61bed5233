"""Plain text: one unit, the whole file (chunked by words afterwards); and how a text file's bytes become text."""

from __future__ import annotations

import codecs

from gradfuse.candidate import Location
from gradfuse.ingest.readers import Parsed, Reading

BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 first: its LE BOM starts
# with UTF-16's


def decode(raw: bytes) -> tuple[str, bool]:
    """(the text of a text file, whether it needed a fallback): by its BOM, else UTF-8, else Windows-1252 or
    latin-1."""
    encoding = next((name for bom, name in BOMS if raw.startswith(bom)), None)
    try:
        return raw.decode(encoding or "utf-8"), False
    except UnicodeDecodeError:
        # Legacy files are usually Windows-1252; latin-1 maps every byte, so nothing is lost either way.
        try:
            return raw.decode("cp1252"), True
        except UnicodeDecodeError:
            return raw.decode("latin-1"), True


def read_text(text: str, name: str, reading: Reading) -> Parsed:
    return Parsed([reading.unit(text, Location(name), 0)], text)
