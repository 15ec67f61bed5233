"""One build of a source at a time: two `gradfuse index` runs on one source used to delete each other's build
folder. An flock on a file in the source's folder is released by the kernel however its holder ends (kill -9
included), so a crashed build never leaves a stale lock."""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from gradfuse.sources.base import SourceError


class SourceBusy(SourceError):
    """Another process is building this source."""


@contextmanager
def source_lock(source_dir: Path, name: str, *, wait: bool = False) -> Iterator[None]:
    """Held for a whole build. Without `wait`, a second build fails at once naming the holder."""
    source_dir.mkdir(parents=True, exist_ok=True)
    with open(source_dir / ".build.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise SourceBusy(f"source {name!r} is being built by {holder}: wait for it to finish, or run again "
                             "with --wait") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} "
                     f"(since {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC)")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
