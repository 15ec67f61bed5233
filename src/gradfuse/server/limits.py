"""What keeps one client, or many, from taking the server down: a cap on open connections, deadlines for a
request's headers and body, and a log that stays bounded under a flood.

uvicorn has no deadline for the request line and headers (a client that sends half a request holds its socket
forever), and its concurrency limit answers 503 only once a request is complete. The protocol below closes a
connection beyond the cap before reading it, and one whose headers are not complete in time; the body deadline is
in `errors.BodyLimit`.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections import OrderedDict

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gradfuse.server")
FD_HEADROOM = 64  # descriptors beyond the connections: indexes, the log, the model files


def guarded_protocol(max_connections: int, header_timeout_s: float,
                     max_client_connections: int | None = None) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with a connection cap, a cap per client address below it (one client that
    reconnects as fast as it is cut off must not hold every place), and a header deadline, re-armed for each
    kept-alive request."""
    per_client = max_client_connections or max_connections

    class GuardedH11Protocol(H11Protocol):
        refused = False
        header_deadline = None

        def connection_made(self, transport) -> None:
            address = _client_address(transport)
            if len(self.connections) >= max_connections:
                self._refuse(transport, "refused a connection: %d open, the limit (max_connections)",
                             len(self.connections))
                return
            if sum(_client_address(c.transport) == address for c in self.connections) >= per_client:
                self._refuse(transport, "refused a connection: %d open from one client address, the limit "
                             "(max_client_connections)", per_client)
                return
            super().connection_made(transport)
            self._arm_header_deadline()

        def _refuse(self, transport, message: str, count: int) -> None:
            self.refused, self.transport = True, transport
            log.warning(message, count)
            transport.abort()

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
                self._disarm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_deadline()

        def connection_lost(self, exc) -> None:
            if self.refused:
                return
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            self._disarm_header_deadline()
            self.header_deadline = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm_header_deadline(self) -> None:
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None

        def _headers_too_slow(self) -> None:
            self.header_deadline = None
            if not self.transport.is_closing():
                log.warning("closed a connection whose request headers took over %s s (header_timeout_s)",
                            header_timeout_s)
                self.transport.close()

    return GuardedH11Protocol


def _client_address(transport) -> str | None:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return peer[0] if isinstance(peer, tuple) and peer else None


def raise_descriptor_limit(max_connections: int) -> None:
    """The soft limit on open files must cover the connection cap, or accept() fails with EMFILE in a loop."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + FD_HEADROOM
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ValueError(f"[server] max_connections = {max_connections} needs {needed} open files, and this "
                         f"process may open at most {hard} (ulimit -Hn): lower max_connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


class RepeatLimit(logging.Filter):
    """Lets the same message through at most `per_minute` times a minute: a flood of refused or broken
    connections must not fill the disk with one line (asyncio once wrote 95 MB of EMFILE errors in 25 s)."""

    def __init__(self, per_minute: int = 10, remembered: int = 256):
        super().__init__()
        self.per_minute, self.remembered = per_minute, remembered
        self._seen: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        # The formatted line: keyed on the template, every access line (and every traceback) shared one cap.
        key = f"{record.name}:{record.levelno}:{record.getMessage()}"
        now = time.monotonic()
        with self._lock:
            times = [t for t in self._seen.pop(key, []) if now - t < 60]
            allowed = len(times) < self.per_minute
            if allowed:
                times.append(now)
            self._seen[key] = times
            while len(self._seen) > self.remembered:
                self._seen.popitem(last=False)
        return allowed


def bound_logs(per_minute: int = 10) -> None:
    """One repeat limit on the loggers a flood writes to: asyncio's, uvicorn's and ours."""
    limit = RepeatLimit(per_minute)
    for name in ("asyncio", "uvicorn.error", "uvicorn.access", "gradfuse.server"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatLimit) for f in logger.filters):
            logger.addFilter(limit)
