"""A source that is another gradfuse server: its `/search` over its own sources, with its own method and key. A
team runs one node per group of sources and asks them from one place; nothing is copied here.

Each passage keeps where it came from: its doc id here is `<remote source>/<doc id>`, with the remote's title,
text, chunk span and location. The remote ranks its passages; their score here is the reciprocal of that rank
(higher is better, whatever method the remote ran), so score fusion over it is right in direction. What the
remote reports as failed, and anything that keeps it from answering (down, slow, a refused key, a malformed
reply), is this source's failure with its reason; the other sources answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from gradfuse.candidate import Candidate, Location
from gradfuse.checked import FILE_SETTINGS, Text
from gradfuse.sources.base import SourceError, SourceStats, check_source_name
from gradfuse.sources.stores import check_address, key_from


@dataclass(frozen=True)
class RemoteSettings:
    """`[sources.NAME]` with `kind = "gradfuse"`."""

    __pydantic_config__ = FILE_SETTINGS
    url: Text  # where `gradfuse serve` listens: http(s)://host:port
    key_env: Text = ""  # the environment variable holding its API key (never the key in the file)
    sources: tuple[str, ...] = ()  # the remote's sources to ask (none: all of them)
    method: Text = ""  # the remote's method ("": the remote's own default)

    def __post_init__(self):
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {self.url!r} is not an http(s) address of a gradfuse server")
        check_address(self.url, "url", self.key_env)
        for name in self.sources:
            check_source_name(name)


class RemoteGradfuse:
    """The source; `timeout_s` bounds each request (the federated search has its own deadline too)."""

    kind = "gradfuse"

    def __init__(self, name: str, settings: RemoteSettings, timeout_s: float, mode: str = "hybrid"):
        self.name, self.settings, self.mode = name, settings, mode  # the remote's sources retrieve this way
        self._client = httpx.Client(base_url=settings.url.rstrip("/"), timeout=timeout_s, trust_env=False)

    def warm(self) -> None:
        """Nothing to load here: the remote embeds its own queries."""

    def search(self, query: str, k: int) -> list[Candidate]:
        body = {"query": query, "k": k, "retrieval": self.mode,
                **({"sources": list(self.settings.sources)} if self.settings.sources else {}),
                **({"method": self.settings.method} if self.settings.method else {})}
        record = self._call("POST", "/search", body)
        try:
            candidates = [_candidate(self.name, rank, row) for rank, row in enumerate(record["candidates"][:k], 1)]
            failed = "; ".join(f"{f['source']}: {f['reason']}" for f in record.get("failures") or [])
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise SourceError(f"gradfuse server {self.settings.url} sent a malformed reply "
                              f"({type(error).__name__}: {error})") from None
        if not candidates and failed:  # the remote answered nothing: why is this source's failure
            raise SourceError(f"gradfuse server {self.settings.url}: its sources failed ({failed})")
        return candidates

    def stats(self) -> SourceStats:
        rows = self._call("GET", "/sources")
        try:
            asked = [r for r in rows if not self.settings.sources or r["name"] in self.settings.sources]
            documents = sum(int(r.get("documents") or 0) for r in asked)
        except (KeyError, TypeError, ValueError) as error:
            raise SourceError(f"gradfuse server {self.settings.url} sent a malformed source list ({error})") from None
        return SourceStats(name=self.name, kind=self.kind, documents=documents, index_bytes=None, encoder=None,
                           built_at="-", input=f"{self.settings.url} ({len(asked)} sources)", retrieval=self.mode)

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, body: dict | None = None):
        key = key_from(self.settings.key_env, "the server's key")
        headers = {"X-API-Key": key} if key else {}
        where = self.settings.url
        try:
            response = self._client.request(method, path, json=body, headers=headers)
        except httpx.TimeoutException:
            raise SourceError(f"gradfuse server {where} did not answer within {self._client.timeout.read:g} s "
                              "(timeout_s)") from None
        except httpx.HTTPError as error:
            raise SourceError(f"gradfuse server {where} cannot be reached ({type(error).__name__})") from None
        if response.status_code == 401:
            raise SourceError(f"gradfuse server {where} refused the key"
                              + (f" in {self.settings.key_env}" if self.settings.key_env else
                                 " (it needs one: name its variable with key_env)"))
        if response.status_code != 200:
            detail = response.json().get("detail") if "json" in response.headers.get("content-type", "") else ""
            raise SourceError(f"gradfuse server {where} answered {response.status_code}: {str(detail)[:300]}")
        try:
            return response.json()
        except ValueError:
            raise SourceError(f"gradfuse server {where} sent a reply that is not JSON") from None


def _candidate(name: str, rank: int, row: dict) -> Candidate:
    """A remote candidate record as this source's passage: namespaced by its remote source, scored by rank."""
    location = row.get("location")
    if location:  # the record's location with what it adds for display left out
        location = Location.from_dict({key: value for key, value in location.items() if key != "cited_as"})
    span = row.get("span")
    return Candidate(source=name, doc_id=f"{row['source']}/{row['doc_id']}", text=str(row["text"]),
                     native_score=1.0 / rank, native_rank=rank, score_kind="1/rank", title=str(row.get("title") or ""),
                     parent_id=row.get("parent_id"), span=tuple(span) if span else None, location=location)
