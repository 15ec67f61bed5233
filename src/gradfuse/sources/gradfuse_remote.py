"""A source that is another gradfuse server: its `/search` over its own sources, with its own method and key. A
team runs one node per group of sources and asks them from one place; nothing is copied here.

Each passage keeps where it came from: its doc id here is `<remote source>/<doc id>`, with the remote's title,
text, chunk span and location. The remote ranks its passages; their score here is the reciprocal of that rank
(higher is better, whatever method the remote ran), so score fusion over it is right in direction. What the
remote reports as failed, and anything that keeps it from answering (down, slow, a refused key, a malformed
reply, one row of it malformed, a reply larger than `max_reply_mb` or slower in all than `timeout_s`), is this
source's failure with its reason; the other sources answer.

What one caller sends must not fail the source for the others (its breaker counts failures in a row): the remote's
own limits (its `/options`) clamp the depth asked of it, a question longer than it takes is not sent, and a 4xx
answer to what was sent (its body, or a rate limit) is that query's failure, counted neither way by the source's
breaker (`CallerRefused`).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gradfuse.access import Readers
from gradfuse.candidate import Candidate, Location
from gradfuse.checked import FILE_SETTINGS, Count, Text
from gradfuse.checked import check_source_name
from gradfuse.sources.base import CallerRefused, SourceError, SourceStats
from gradfuse.sources.stores import check_address, key_from
from gradfuse.sources.summary import SourceSummary


@dataclass(frozen=True)
class RemoteSettings:
    """`[sources.NAME]` with `kind = "gradfuse"`."""

    __pydantic_config__ = FILE_SETTINGS
    url: Text  # where `gradfuse serve` listens: http(s)://host:port
    key_env: Text = ""  # the environment variable holding its API key (never the key in the file)
    sources: tuple[str, ...] = ()  # the remote's sources to ask (none: all of them)
    method: Text = ""  # the remote's method ("": the remote's own default)
    max_reply_mb: Count = 16  # a larger reply is this source's failure, read no further

    def __post_init__(self):
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {self.url!r} is not an http(s) address of a gradfuse server")
        check_address(self.url, "url", self.key_env)
        for name in self.sources:
            check_source_name(name)


LIMITS_TTL_S = 300.0  # how long the remote's limits are trusted before they are read again
# A remote's summary is made from its largest sources' summaries, this many at most: one request each, and the
# merged summary keeps no more than one source's anyway (SourceSummary.merged).
MAX_SUMMARIES_READ = 64
# Answers to what a caller sent (its question, its depth; 429: one caller's flood the remote limits): that query's
# failure, counted neither way by the breaker. 401 and 403 are the key's, 404 or 405 say the address is no gradfuse
# server, and 414 or 431 are of the URL and headers, which no caller chooses: those stay the source's failures.
_CALLERS_4XX = frozenset({400, 413, 422, 429})


class RemoteGradfuse:
    """The source; `timeout_s` bounds each request, whole (the federated search has its own deadline too)."""

    kind = "gradfuse"

    def __init__(self, name: str, settings: RemoteSettings, timeout_s: float, mode: str = "hybrid"):
        self.name, self.settings, self.mode = name, settings, mode  # the remote's sources retrieve this way
        self._timeout_s = timeout_s
        # A connection per request: its socket is known (see `_call`), so it can be cut at the deadline. Replies
        # are read uncompressed, so `max_reply_mb` bounds what is held (a 25 KB zstd reply was 800 MB decoded).
        self._client = httpx.Client(base_url=settings.url.rstrip("/"), timeout=timeout_s, trust_env=False,
                                    limits=httpx.Limits(max_keepalive_connections=0),
                                    headers={"Accept-Encoding": "identity"})
        self._limits: tuple[float, _Limits] | None = None  # when read, and what

    def warm(self) -> None:
        """Nothing to load here: the remote embeds its own queries."""

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        # The remote reads as the principal its key stands for there, and filters by it inside its own sources:
        # this side decides only who may read the source (docs/access.md).
        limits = self.limits()
        if limits.max_query_chars is not None and len(query) > limits.max_query_chars:
            raise CallerRefused(f"gradfuse server {self.settings.url} takes questions of at most "
                                f"{limits.max_query_chars} characters; this one has {len(query)}")
        k = min(k, limits.max_k or k, limits.max_depth or k)
        body = {"query": query, "k": k, "retrieval": self.mode,
                **({"sources": list(self.settings.sources)} if self.settings.sources else {}),
                **({"method": self.settings.method} if self.settings.method else {})}
        reply = self._read(_Reply, self._call("POST", "/search", body), "reply")
        candidates = [row.candidate(self.name, rank) for rank, row in enumerate(reply.candidates[:k], start=1)]
        if not candidates and reply.failures:  # the remote answered nothing: why is this source's failure
            failed = "; ".join(f"{f.source}: {f.reason}" for f in reply.failures)
            raise SourceError(f"gradfuse server {self.settings.url}: its sources failed ({failed})")
        return candidates

    def limits(self) -> _Limits:
        """The remote's limits from its `/options`, read again after LIMITS_TTL_S; none known where it serves none
        (an older server), or where they cannot be read now (the search itself then says why)."""
        if self._limits is None or time.monotonic() - self._limits[0] > LIMITS_TTL_S:
            try:
                read = self._read(_Options, self._call("GET", "/options"), "options").limits
            except SourceError:
                read = _Limits()
            self._limits = (time.monotonic(), read)
        return self._limits[1]

    def stats(self) -> SourceStats:
        rows = self._read(_SOURCE_LIST, self._call("GET", "/sources"), "source list")
        asked = [r for r in rows if not self.settings.sources or r.name in self.settings.sources]
        return SourceStats(name=self.name, kind=self.kind, documents=sum(r.documents or 0 for r in asked),
                           index_bytes=None, encoder=None, built_at="-",
                           input=f"{self.settings.url} ({len(asked)} sources)", retrieval=self.mode)

    def change_marker(self) -> str:
        """What moves when a source this one asks is built again there: its build time and size."""
        rows = self._read(_SOURCE_LIST, self._call("GET", "/sources"), "source list")
        return repr(sorted((r.name, r.documents, r.built_at) for r in rows
                           if not self.settings.sources or r.name in self.settings.sources))

    def summary(self, encoder: str) -> SourceSummary:
        """The remote's own summaries of the sources this one asks, as one (for routing here)."""
        listed = self._read(_SOURCE_LIST, self._call("GET", "/sources"), "source list")
        sizes = {r.name: r.documents or 0 for r in listed}
        asked = self.settings.sources or sorted(sizes, key=lambda name: -sizes[name])
        # an emptied source there (a folder whose files all went) has an empty summary: it adds nothing
        names = sorted((name for name in asked if sizes.get(name, 1)), key=lambda name: -sizes.get(name, 0))
        parts = []
        for remote in names[:MAX_SUMMARIES_READ]:
            sent = self._read(_Summary, self._call("GET", f"/sources/{remote}/summary"), "summary")
            if sent.encoder != encoder:
                raise SourceError(f"gradfuse server {self.settings.url}: {remote}'s summary is in {sent.encoder}'s "
                                  f"space, not {encoder}'s")
            try:
                summary = SourceSummary.from_wire(sent.documents, sent.dimension, sent.centroids, sent.shares,
                                                  sent.sample)
            except ValueError as error:
                raise SourceError(f"gradfuse server {self.settings.url} sent a malformed summary of {remote} "
                                  f"({error})") from None
            parts.append(summary)
        if not asked:
            raise SourceError(f"gradfuse server {self.settings.url} has no sources")
        return SourceSummary.merged(parts)

    def _read(self, shape, body: bytes, what: str):
        """The reply read as `shape`, strictly: a malformed row fails this source, with where and why."""
        try:
            return (shape if isinstance(shape, TypeAdapter) else TypeAdapter(shape)).validate_json(body)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "the reply"
            raise SourceError(f"gradfuse server {self.settings.url} sent a malformed {what} ({where}: "
                              f"{first['msg'][:120]}; {error.error_count()} problem(s))") from None

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, body: dict | None = None) -> bytes:
        """The reply's body, read whole within `timeout_s` in all and at most `max_reply_mb`. httpx's timeout is
        per read, so a server sending a byte a second, in its body or in its headers, would never trip it: at the
        deadline the connection is cut instead."""
        key = key_from(self.settings.key_env, "the server's key")
        headers = {"X-API-Key": key} if key else {}
        where, limit = self.settings.url, self.settings.max_reply_mb * 1024 * 1024
        connection = _Connection(self._timeout_s)
        try:
            with self._client.stream(method, path, json=body, headers=headers,
                                     extensions={"trace": connection.trace}) as response:
                if response.headers.get("content-encoding", "identity").lower() != "identity":
                    raise SourceError(f"gradfuse server {where} sent a compressed reply "
                                      f"({response.headers['content-encoding'][:40]}), which is not read")
                if int(response.headers.get("content-length") or 0) > limit:
                    raise self._too_large()
                chunks, size = [], 0
                for chunk in response.iter_raw():
                    size += len(chunk)
                    if size > limit:
                        raise self._too_large()
                    chunks.append(chunk)
        except httpx.HTTPError as error:
            if connection.cut or isinstance(error, httpx.TimeoutException):
                raise SourceError(f"gradfuse server {where} did not answer within {self._timeout_s:g} s "
                                  "(timeout_s)") from None
            raise SourceError(f"gradfuse server {where} cannot be reached ({type(error).__name__})") from None
        finally:
            connection.done()
        content = b"".join(chunks)
        if response.status_code == 401:
            raise SourceError(f"gradfuse server {where} refused the key"
                              + (f" in {self.settings.key_env}" if self.settings.key_env else
                                 " (it needs one: name its variable with key_env)"))
        if response.status_code in _CALLERS_4XX:
            self._limits = None  # its limits may have changed: read them again
            raise CallerRefused(f"gradfuse server {where} refused this request ({response.status_code}: "
                                f"{_detail(content)[:300]})")
        if response.status_code != 200:
            raise SourceError(f"gradfuse server {where} answered {response.status_code}: {_detail(content)[:300]}")
        return content

    def _too_large(self) -> SourceError:
        return SourceError(f"gradfuse server {self.settings.url} sent a reply larger than "
                           f"{self.settings.max_reply_mb} MB (max_reply_mb), read no further")


class _Connection:
    """One request's connection, cut (shut down, which wakes a blocked read) if the request outlasts `seconds`."""

    def __init__(self, seconds: float):
        self._streams = []
        self._lock = threading.Lock()
        self.cut = False
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict) -> None:
        """httpcore's hook: the new connection's stream, once connected."""
        if event == "connection.connect_tcp.complete":
            with self._lock:
                self._streams.append(info["return_value"])
                if self.cut:  # connected just after the deadline
                    self._shut(info["return_value"])

    def _cut(self) -> None:
        with self._lock:
            self.cut = True
            for stream in self._streams:
                self._shut(stream)

    @staticmethod
    def _shut(stream) -> None:
        try:
            stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass

    def done(self) -> None:
        self._timer.cancel()


def _detail(content: bytes) -> str:
    """What an error reply says, where it is gradfuse's JSON error."""
    try:
        detail = TypeAdapter(dict).validate_json(content).get("detail")
    except ValidationError:
        return ""
    return detail if isinstance(detail, str) else ""


_STRICT = ConfigDict(strict=True, extra="ignore")


class _Location(BaseModel):
    model_config = _STRICT
    file: str
    page: int | None = None
    slide: int | None = None
    sheet: str | None = None
    rows: tuple[int, int] | None = None
    headings: tuple[str, ...] = ()


class _Row(BaseModel):
    """One of the remote's candidate records, as far as this source reads it."""

    model_config = _STRICT
    source: str
    doc_id: str
    text: str
    title: str | None = ""
    parent_id: str | None = None
    span: tuple[int, int] | None = None
    cut_from: int | None = None
    location: _Location | None = None

    def candidate(self, name: str, rank: int) -> Candidate:
        """This source's passage: namespaced by its remote source, scored by rank."""
        location = Location(**self.location.model_dump()) if self.location else None
        return Candidate(source=name, doc_id=f"{self.source}/{self.doc_id}", text=self.text, native_score=1.0 / rank,
                         native_rank=rank, score_kind="1/rank", title=self.title or "", parent_id=self.parent_id,
                         span=self.span, cut_from=self.cut_from, location=location)


class _Failed(BaseModel):
    model_config = _STRICT
    source: str
    reason: str


class _Reply(BaseModel):
    model_config = _STRICT
    candidates: list[_Row]
    failures: list[_Failed] = Field(default_factory=list)


class _Listed(BaseModel):
    model_config = _STRICT
    name: str
    documents: int | None = None
    built_at: str | None = None


_SOURCE_LIST = TypeAdapter(list[_Listed])


class _Limits(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    max_query_chars: int | None = Field(default=None, ge=1)
    max_k: int | None = Field(default=None, ge=1)
    max_depth: int | None = Field(default=None, ge=1)


class _Options(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    limits: _Limits = Field(default_factory=_Limits)


class _Summary(BaseModel):
    model_config = _STRICT
    documents: int = Field(ge=0)
    encoder: str
    dimension: int = Field(ge=1, le=65_536)
    centroids: str
    shares: list[float]
    sample: str
