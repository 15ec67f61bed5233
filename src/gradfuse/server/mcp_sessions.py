"""ASGI middleware for /mcp: each MCP session belongs to the key that opened it, and one key holds at most
`[server] max_mcp_sessions_per_key` of them.

The SDK bounds sessions only in all (`max_mcp_sessions`): one key opening that many blocked MCP for every other key
until its sessions idled out, and any key that knew a session's id could use it or close it. Here a request naming
another key's session is answered as an unknown one (404), and a key at its quota is refused a new session (429)
until one of its own is closed (DELETE /mcp) or idle for `mcp_idle_timeout_s`, as the SDK closes it. The
single-key and keyless servers have one principal: the SDK's bound alone applies there."""

from __future__ import annotations

import threading
import time

from gradfuse.access import EVERYTHING
from gradfuse.server.errors import error_response

SESSION_HEADER = b"mcp-session-id"


class McpSessionsPerKey:
    def __init__(self, app, per_key: int, idle_s: float, path: str = "/mcp"):
        self.app, self.per_key, self.idle_s, self.path = app, per_key, idle_s, path
        self._sessions: dict[str, tuple[str, float]] = {}  # session id: (its key's principal, last used)
        self._in_flight: dict[str, int] = {}  # session id: its requests running (a stream held open is use)
        self._opening: dict[str, int] = {}  # principal: its requests that may open a session, not yet answered
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].rstrip("/") != self.path:
            await self.app(scope, receive, send)
            return
        principal = scope.get("state", {}).get("principal", EVERYTHING)
        named = [value for header, value in scope["headers"] if header == SESSION_HEADER]
        if len(named) > 1:  # the SDK reads the first, a check here the last: one request names one session
            await error_response(scope["path"], 400, "a request names one MCP session (one Mcp-Session-Id "
                                 "header)")(scope, receive, send)
            return
        if named:
            await self._in_session(named[0].decode("latin-1"), principal, scope, receive, send)
        else:
            await self._opening_one(principal, scope, receive, send)

    async def _in_session(self, session, principal, scope, receive, send):
        with self._lock:
            owner = self._sessions.get(session)
            mine = owner is not None and owner[0] == principal.name
            if mine:
                self._in_flight[session] = self._in_flight.get(session, 0) + 1
        if owner is not None and not mine:  # as the SDK answers an unknown session
            await error_response(scope["path"], 404, "Session not found")(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            if mine:
                with self._lock:
                    self._in_flight[session] -= 1
                    if not self._in_flight[session]:
                        del self._in_flight[session]
                    if scope["method"] == "DELETE":
                        self._sessions.pop(session, None)
                    elif session in self._sessions:
                        self._sessions[session] = (principal.name, time.monotonic())

    async def _opening_one(self, principal, scope, receive, send):
        quota = principal.name != EVERYTHING.name
        with self._lock:  # a place is taken before the SDK is called: requests sent at once cannot pass together
            if quota and self._held(principal.name) + self._opening.get(principal.name, 0) >= self.per_key:
                refused = True
            else:
                refused = False
                self._opening[principal.name] = self._opening.get(principal.name, 0) + 1
        if refused:
            await error_response(scope["path"], 429, f"this key holds {self.per_key} open MCP sessions, its most "
                                 "([server] max_mcp_sessions_per_key): close one (DELETE /mcp with its "
                                 "Mcp-Session-Id) or wait until one has been idle for mcp_idle_timeout_s")(
                scope, receive, send)
            return

        async def noting_the_new_session(message):
            if message["type"] == "http.response.start":
                opened = dict(message.get("headers", [])).get(SESSION_HEADER)
                if opened:
                    with self._lock:
                        self._sessions[opened.decode("latin-1")] = (principal.name, time.monotonic())
            await send(message)

        try:
            await self.app(scope, receive, noting_the_new_session)
        finally:
            with self._lock:
                self._opening[principal.name] -= 1
                if not self._opening[principal.name]:
                    del self._opening[principal.name]

    def _held(self, name: str) -> int:
        """The sessions `name` holds (under the lock), forgetting those idle past the SDK's timeout with no request
        running (it has closed them)."""
        now = time.monotonic()
        for session, (owner, used) in list(self._sessions.items()):
            if now - used > self.idle_s and not self._in_flight.get(session):
                del self._sessions[session]
        return sum(owner == name for owner, _ in self._sessions.values())
