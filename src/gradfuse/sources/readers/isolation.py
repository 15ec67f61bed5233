"""Parsers run in a worker process, one file at a time, with a deadline per file: a file that makes a parser hang
or crash costs its deadline, is skipped with its reason, and the worker is replaced for the next file.

The worker is `python -m gradfuse.sources.readers.isolation`, a fresh interpreter (not a fork: the builder's
threads and loaded models are not copied), spoken to by length-prefixed pickles over its stdin and stdout.
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import struct
import subprocess
import sys
from dataclasses import asdict

from gradfuse.sources.readers import Parsed, ReaderLimits, Unreadable, parse

_LENGTH = struct.Struct(">Q")


def _send(stream, value) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    (length,) = _LENGTH.unpack(head)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError
    return pickle.loads(data)


def _serve() -> None:
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a parser's prints must not enter the channel
    for parser in ("docx", "openpyxl", "pptx", "pypdfium2"):  # loaded before the first deadline runs
        importlib.import_module(parser)

    _send(sink, "ready")
    while True:
        try:
            data, kind, name, limits = _receive(source)
        except EOFError:
            return
        try:
            _send(sink, ("ok", parse(data, kind, name, ReaderLimits(**limits))))
        except Unreadable as error:
            _send(sink, ("unreadable", (error.reason, str(error))))
        except Exception as error:  # a parser's own failure on this file: the file is at fault, not the build
            _send(sink, ("unreadable", ("corrupt", f"{type(error).__name__}: {error}")))


class ParserWorker:
    """One worker process, started on first use and replaced after a file overran its deadline or crashed it."""

    def __init__(self):
        self._process: subprocess.Popen | None = None

    def parse(self, data: bytes, kind: str, name: str, limits: ReaderLimits) -> Parsed:
        if self._process is None:
            self._start()
        try:
            _send(self._process.stdin, (data, kind, name, asdict(limits)))
            ready, _, _ = select.select([self._process.stdout], [], [], limits.deadline_s)
            if not ready:
                self._stop(kill=True)
                raise Unreadable("deadline", f"not parsed within {limits.deadline_s:g} s (--deadline-s)")
            status, value = _receive(self._process.stdout)
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the parser took the worker down
            self._stop(kill=True)
            raise Unreadable("corrupt", "the parser crashed on it") from None
        if status == "unreadable":
            raise Unreadable(*value)
        return value

    def _start(self) -> None:
        """A new worker, once it has loaded its parsers (their import is not part of any file's deadline)."""
        self._process = subprocess.Popen([sys.executable, "-m", "gradfuse.sources.readers.isolation"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            if _receive(self._process.stdout) != "ready":
                raise EOFError
        except EOFError:
            self._stop(kill=True)
            raise RuntimeError("the file parser's worker process did not start "
                               f"({sys.executable} -m gradfuse.sources.readers.isolation)") from None

    def _stop(self, *, kill: bool) -> None:
        if self._process is None:
            return
        process, self._process = self._process, None
        if kill:
            process.kill()
        else:
            try:
                process.stdin.close()  # the worker's end of input: it returns
            except OSError:
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()

    def close(self) -> None:
        self._stop(kill=False)

    def __enter__(self) -> ParserWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    _serve()
