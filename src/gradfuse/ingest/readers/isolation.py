"""Every file is read in a worker process, one file at a time: a file that makes a parser hang, crash or take
memory costs at most its limits, is skipped with its reason, and the worker is replaced for the next file.

The worker is a fresh interpreter (not a fork: the builder's threads and loaded models are not copied), isolated
from where it was started: `python -I` (no current folder, user site or PYTHON* variables on its path: a
`docx.py` in the folder being indexed must not run), started in "/", with only the environment a parser needs
(no API keys), in a session of its own. It dies with its parent (a parent-death signal), and limits itself per
file: address space (`max_worker_mb`) and CPU time (the deadline's, should the parent not be there to enforce
it). It is spoken to by length-prefixed pickles over its stdin and stdout; a reply larger than a file's text
budget allows is refused unread.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import math
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import asdict
from pathlib import Path

from gradfuse.ingest.readers import Parsed, ReaderLimits, Unreadable, parse

_LENGTH = struct.Struct(">Q")
# What a parser needs of the environment (Tesseract is found on PATH); nothing else, keys included, is passed.
_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TESSDATA_PREFIX", "OMP_THREAD_LIMIT")
_BOOT = ("import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
         "from gradfuse.ingest.readers.isolation import serve; serve(int(sys.argv[2]))")
_PR_SET_PDEATHSIG = 1


class _TooLong(Exception):
    pass


def _send(stream, value) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)))  # apart: joined, a 200 MB file was held a third time
    stream.write(data)
    stream.flush()


def _receive(stream, limit: int | None = None):
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    (length,) = _LENGTH.unpack(head)
    if limit is not None and length > limit:
        raise _TooLong(length)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError
    return pickle.loads(data)


def reply_limit(limits: ReaderLimits) -> int:
    """Bytes a parse's reply may take: its units' text and the joined text, up to 4 UTF-8 bytes a character, and
    room for their places."""
    return (8 * limits.max_text_mb + 16) * 1_000_000


def serve(parent: int) -> None:
    """The worker's loop (started by ParserWorker with the parent's pid)."""
    if sys.platform.startswith("linux"):  # elsewhere the closed stdin ends an idle worker, and the CPU limit a busy one
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the signal was asked for
        return
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a parser's prints must not enter the channel
    for parser in ("docx", "openpyxl", "pptx", "pypdfium2", "trafilatura", "bs4"):  # before any deadline runs
        importlib.import_module(parser)
    _send(sink, "ready")
    while True:
        try:
            data, suffix, name, fields = _receive(source)
        except EOFError:
            return
        limits = ReaderLimits(**fields)
        _limit_this_file(limits)
        try:
            _send(sink, ("ok", parse(data, suffix, name, limits)))
        except Unreadable as error:
            _send(sink, ("unreadable", (error.reason, str(error))))
        except MemoryError:
            _send(sink, ("unreadable", ("too much memory", f"its parse needed over {limits.max_worker_mb} MB "
                                                           "(--max-worker-mb)")))
        except Exception as error:  # a parser's own failure on this file: the file is at fault, not the build
            _send(sink, ("unreadable", ("corrupt", f"{type(error).__name__}: {error}")))


def _limit_this_file(limits: ReaderLimits) -> None:
    """The worker's memory, and CPU time for this file: its deadline (SIGXCPU ends the worker), so that a worker
    whose parent cannot kill it stops on its own."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    for kind, value in ((resource.RLIMIT_AS, limits.max_worker_mb * 1024 * 1024),
                        (resource.RLIMIT_CPU, math.ceil(used.ru_utime + used.ru_stime + limits.deadline_s) + 1)):
        _, hard = resource.getrlimit(kind)  # a soft limit, never above the hard one the worker was given
        resource.setrlimit(kind, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))


class ParserWorker:
    """One worker process, started on first use and replaced after a file overran a limit or crashed it."""

    def __init__(self):
        self._process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def parse(self, data: bytes, suffix: str, name: str, limits: ReaderLimits) -> tuple[str, Parsed | None]:
        """(format, parse) of one file; Unreadable says why a file cannot be read."""
        if self._process is not None and self._process.poll() is not None:  # it died between files: not this
            self._stop()                                                     # file's fault
        if self._process is None:
            self._start()
        try:
            _send(self._process.stdin, (data, suffix, name, asdict(limits)))
            ready, _, _ = select.select([self._process.stdout], [], [], limits.deadline_s)
            if not ready:
                self._stop()
                raise Unreadable("deadline", f"not parsed within {limits.deadline_s:g} s (--deadline-s)")
            status, value = _receive(self._process.stdout, reply_limit(limits))
        except _TooLong as error:
            self._stop()
            raise Unreadable("too much text", f"its parse came to {error.args[0] / 1e6:.0f} MB "
                                              f"(--max-text-mb {limits.max_text_mb})") from None
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the parser took the worker down
            signal_number = self._stop(grace_s=2)
            if signal_number == signal.SIGXCPU:
                raise Unreadable("deadline", f"not parsed within {limits.deadline_s:g} s of CPU (--deadline-s)") \
                    from None
            raise Unreadable("corrupt", f"the parser crashed on it (or ran out of its {limits.max_worker_mb} MB: "
                                        "--max-worker-mb)") from None
        if status == "unreadable":
            raise Unreadable(*value)
        return value

    def _start(self) -> None:
        """A new worker, once it has loaded its parsers (their import is not part of any file's deadline)."""
        here = Path.cwd().resolve()
        path = [entry for entry in sys.path if entry and Path(entry).resolve() != here]
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, json.dumps(path), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/",
            env={name: os.environ[name] for name in _ENVIRONMENT if name in os.environ}, start_new_session=True)
        try:
            if _receive(self._process.stdout) != "ready":
                raise EOFError
        except EOFError:
            self._stop()
            raise RuntimeError(f"the file parser's worker process did not start ({sys.executable} -I -c "
                               "'...isolation import serve')") from None

    def _stop(self, *, grace_s: float = 0.0) -> int | None:
        """End the worker: killed with its process group (a Tesseract it started included) after `grace_s` to end by
        itself; the signal that ended it, if one did."""
        if self._process is None:
            return None
        process, self._process = self._process, None
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        return -process.returncode if process.returncode < 0 else None

    def close(self) -> None:
        # Killed, not told to return: an idle worker holds nothing to finish, and its interpreter's exit with every
        # parser imported took 0.16 s, a tenth of a `gradfuse index` of a few changed files.
        self._stop()

    def __enter__(self) -> ParserWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_KEPT: ContextVar[ParserWorker | None] = ContextVar("kept_parser", default=None)


@contextlib.contextmanager
def parser_kept() -> Iterator[ParserWorker]:
    """One worker for every file read in this context, kept between reads (a watcher's syncs: starting one costs
    about half a second, most of a sync of a few files)."""
    worker = ParserWorker()
    token = _KEPT.set(worker)
    try:
        yield worker
    finally:
        _KEPT.reset(token)
        worker.close()


def kept_parser() -> ParserWorker | None:
    """The worker `parser_kept` keeps for this context, if any."""
    return _KEPT.get()
