"""Folders only their owner reads: an index, a cache or a parser's copy holds the documents' text."""

from __future__ import annotations

import os
from pathlib import Path


def private_folder(folder: Path, *, up_to: Path | None = None) -> Path:
    """`folder` (made if missing), and each folder above it up to `up_to`, readable by its owner only: an index
    holds the documents' text, and under the usual umask 022 anyone on the machine could read it."""
    folder.mkdir(parents=True, exist_ok=True)
    level = folder
    while True:
        os.chmod(level, 0o700)
        if up_to is None or level == up_to or level.parent == level:
            return folder
        level = level.parent
