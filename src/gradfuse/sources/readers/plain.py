"""Plain text: one unit, the whole file (chunked by words afterwards)."""

from __future__ import annotations

from gradfuse.candidate import Location
from gradfuse.sources.readers import Parsed, Unit


def read_text(text: str, name: str) -> Parsed:
    return Parsed([Unit(text, Location(name), 0)], text)
