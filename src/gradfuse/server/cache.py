"""Repeated questions are free: the server keeps what /search and /ask answered, keyed by the request and by the
published version of every index it read, so a publish (any source rebuilt, added or removed) makes the old entries
unreachable; they leave as the least recently used.

Not kept: a result where a source failed (the failure may pass), and anything that read a PostgreSQL source or
one an engine serves (its data changes without a publish). What is kept is the JSON that was sent, bounded in all
by `[server] cache_mb` (0 turns it off).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pydantic import BaseModel

from gradfuse.access import Principal
from gradfuse.sources.base import SourceError


# What a request may set that does not change its result: how long the sources may take (a result that timed out
# has a failure and is not kept), and whether an answer streams.
_NOT_IN_KEY = {"timeout_s", "stream"}


class ResultCache:
    def __init__(self, workspace, megabytes: int):
        self._workspace, self._room = workspace, megabytes * 1_000_000
        self._kept: OrderedDict[tuple, tuple[tuple[str, ...], int]] = OrderedDict()  # the texts, and their bytes
        self._used = 0  # bytes of JSON kept (UTF-8)
        self._lock = threading.Lock()
        self.hits = self.misses = 0  # lookups of requests that may be kept (for /metrics)

    def key(self, endpoint: str, request: BaseModel, principal: Principal) -> tuple | None:
        """The request, who asks (each principal its own entries: Principal.fingerprint), and the versions of the
        indexes it reads; None where it must not be kept."""
        if not self._room:
            return None
        try:
            names = self._workspace.catalog.resolve(request.sources, principal)
        except SourceError:  # the search itself says why (in the same words)
            return None
        published = self._workspace.catalog.publish_key(sorted(names))
        if published is None:  # a source's data changes without a publish here
            return None
        options = json.dumps(request.model_dump(exclude=_NOT_IN_KEY), sort_keys=True)
        return endpoint, options, published, principal.fingerprint()

    def get(self, key: tuple | None) -> tuple[str, ...] | None:
        if key is None:
            return None
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                self.misses += 1
                return None
            self.hits += 1
            self._kept.move_to_end(key)
            return kept[0]

    def put(self, key: tuple | None, value: tuple[str, ...], *, failed: bool) -> None:
        """Keep the JSON texts of a result (the least recently used leave to make room)."""
        size = _bytes(value)
        if key is None or failed or size > self._room:
            return
        with self._lock:
            if key in self._kept:
                self._used -= self._kept.pop(key)[1]
            self._kept[key] = (value, size)
            self._used += size
            while self._used > self._room:
                _, (_, dropped) = self._kept.popitem(last=False)
                self._used -= dropped


def _bytes(texts: tuple[str, ...]) -> int:
    """What the texts take, counted as UTF-8 (a character of an astral plane is 4 bytes; CPython holds such a
    string at 4 bytes a character too): `len` let the cache grow to 4 x cache_mb."""
    return sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
