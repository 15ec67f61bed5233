"""What a folder's syncs last saw of each file: its stat and the hash of its bytes then. A file whose stat has not
moved since is not opened again. Kept beside the source's versions, not in one (a file found unchanged after its
stat moved is recorded without publishing anything); losing it costs one sync that hashes every file again.

A file written within RACY_NS before it was looked at may be written again without its stat moving (two writes
within the filesystem's clock resolution: a second on some): until a later look, its stat is not trusted, as git
does with "racy" index entries.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from gradfuse.ingest.files import ListedFile

RACY_NS = 2_000_000_000


class FileStamps:
    def __init__(self, path: Path):
        try:
            self._db, self._rows = self._open(path)
        except sqlite3.DatabaseError:  # damaged, or of another layout: it is only a cache of what was seen
            path.unlink(missing_ok=True)
            self._db, self._rows = self._open(path)
        self._changed: dict[str, tuple] = {}

    @staticmethod
    def _open(path: Path) -> tuple[sqlite3.Connection, dict]:
        db = sqlite3.connect(path)
        try:
            os.chmod(path, 0o600)  # the folder's file names
            db.execute("CREATE TABLE IF NOT EXISTS stamps (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
                       "ctime_ns INTEGER, inode INTEGER, digest TEXT NOT NULL, seen_ns INTEGER NOT NULL)")
            rows = {path: (tuple(stamp), digest, seen) for path, *stamp, digest, seen in
                    db.execute("SELECT path, size, mtime_ns, ctime_ns, inode, digest, seen_ns FROM stamps")}
        except BaseException:
            db.close()
            raise
        return db, rows

    def digest(self, file: ListedFile) -> str | None:
        """The hash of the file's bytes when its stat was last seen as it is now, unless that stat is racy."""
        row = self._rows.get(file.relative)
        # ctime too: a copy that keeps the file's times (cp -p, tar, rsync -t) sets mtime back, never ctime
        if row is None or row[0] != file.stamp or max(file.mtime_ns, file.ctime_ns) >= row[2] - RACY_NS:
            return None
        return row[1]

    def record(self, file: ListedFile, digest: str, seen_ns: int) -> None:
        self._rows[file.relative] = self._changed[file.relative] = (file.stamp, digest, seen_ns)

    def save(self, listed: set[str]) -> None:
        """Write what was recorded, and forget the files no longer `listed`."""
        gone = [(path,) for path in self._rows if path not in listed]
        with self._db:
            self._db.executemany("DELETE FROM stamps WHERE path = ?", gone)
            self._db.executemany("INSERT OR REPLACE INTO stamps VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 [(path, *stamp, digest, seen) for path, (stamp, digest, seen) in
                                  self._changed.items()])
        self._changed.clear()

    def close(self) -> None:
        self._db.close()
