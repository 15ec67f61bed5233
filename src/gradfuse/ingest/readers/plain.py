"""Plain text: one unit, the whole file (chunked by words afterwards); and how a text file's bytes become text."""

from __future__ import annotations

import codecs
import re

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


# An encoding a file declares in its first lines: "-*- coding: latin-1 -*-" (Python, Emacs), "vim: set
# fileencoding=...", <meta charset="..."> or <?xml ... encoding="..."?>.
_DECLARED = re.compile(rb"(?:coding[:=]|charset=|encoding=)\s*[\"']?([-\w.]+)", re.IGNORECASE)


def looks_like_text(head: bytes) -> bool:
    """Whether a file's first bytes (of a name gradfuse reads by no suffix) are text: a BOM; or no NUL byte and
    UTF-8 (a character cut by the end of `head` allowed) or the encoding the first two lines declare."""
    if any(head.startswith(bom) for bom, _ in BOMS):
        return True
    if b"\x00" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return True
    except UnicodeDecodeError:
        pass
    declared = _DECLARED.search(b"\n".join(head.split(b"\n", 2)[:2]))
    try:
        codec = codecs.lookup(declared.group(1).decode("ascii"))
        if not codec._is_text_encoding:  # "hex", "base64", "zlib": codecs of bytes, which say nothing of text
            return False
        codec.incrementaldecoder().decode(head, final=False)
        return True
    except Exception:  # noqa: BLE001 - none declared, an unknown codec, bytes not in it: no text, one file skipped
        return False


def read_text(text: str, name: str, reading: Reading) -> Parsed:
    return Parsed([reading.unit(text, Location(name), 0)], text)
