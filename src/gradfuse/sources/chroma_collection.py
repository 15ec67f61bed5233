"""`kind = "chroma"`: a collection on a Chroma server (`uri = "http://host:8000"`, a token from `key_env` sent as a
bearer token), read through Chroma's HTTP client with the query embedded by `query_encoder` (the collection's own
embedding function is never called: nothing is downloaded), each request bounded by the source's timeout. A passage's id is Chroma's id, its text the stored
document (or `text_field` of its metadata), its title `title_field` of its metadata. Every Chroma space (l2,
cosine, ip) returns a distance, lower for closer: negated so that higher is better.

`readers_field` is a metadata key holding a list of names (Chroma 1.5 keeps non-empty lists of text in metadata and
filters them with `$contains`), or one name as text; a passage for every reader of the collection holds ["*"] ("*"
is no reader's name). Chroma stores no null or empty list, and its `where` cannot ask for a missing key: a passage
without the key is read only by callers who may read every document."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

import httpx

from gradfuse.access import Readers
from gradfuse.candidate import Candidate
from gradfuse.checked import Text
from gradfuse.sources.base import SourceError, SourceStats
from gradfuse.sources.stores import StoreSettings, engine_client, sample_text, sample_windows

EVERY_READER = "*"  # in `readers_field`: the passage is for every reader (Chroma can ask for no missing key)


@dataclass(frozen=True, kw_only=True)
class ChromaSettings(StoreSettings):
    collection: Text
    filter_type: ClassVar[type] = dict  # Chroma's `where`: {genre = "faq"}, {year = {"$gte" = 2021}}

    def __post_init__(self):
        super().__post_init__()
        if urlsplit(self.uri).scheme not in ("http", "https"):
            raise ValueError(f"uri {self.uri!r} is not the http(s) address of a Chroma server (chroma run)")


class ChromaCollection:
    kind = "chroma"

    def __init__(self, name: str, settings: ChromaSettings, timeout_s: float, mode: str = "dense"):
        chromadb = engine_client("chromadb")
        self.name, self.settings, self.mode = name, settings, "dense"  # Chroma's search here is by vector
        parts, key = urlsplit(settings.uri), settings.key()
        try:
            _reachable(settings.uri, key, timeout_s)
            client = chromadb.HttpClient(host=parts.hostname, port=parts.port or (443 if parts.scheme == "https"
                                                                                 else 8000),
                                         ssl=parts.scheme == "https",
                                         headers={"Authorization": f"Bearer {key}"} if key else None,
                                         settings=chromadb.Settings(anonymized_telemetry=False))  # no calls out
            _bound(client, timeout_s)
            self._collection = client.get_collection(settings.collection, embedding_function=None)
            space = (self._collection.metadata or {}).get("hnsw:space") or _space(self._collection)
        except Exception as error:  # the client raises its own errors, ValueError and connection errors
            raise SourceError(f"chroma {settings.uri}: collection {settings.collection!r} cannot be read "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        self._score_kind = f"-{space} distance"

    def warm(self) -> None:
        self.settings.warm()

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        s = self.settings
        found = self._collection.query(query_embeddings=[s.query_vector(query)], n_results=k,
                                       where=self._where(readers), include=["documents", "metadatas", "distances"])
        rows = zip(found["ids"][0], found["documents"][0], found["metadatas"][0], found["distances"][0])
        return [s.candidate(self.name, rank, self._readable_row(doc_id, document, metadata), -distance,
                            self._score_kind)
                for rank, (doc_id, document, metadata, distance) in enumerate(rows, start=1)]

    def _where(self, readers: Readers) -> dict | None:
        """Chroma's `where` of a search: `filter`, and where `readers` are restricted, the passages they may read
        (a list naming "*" or one of them, or the text "*" or one of them)."""
        s, names = self.settings, self.settings.restricted_to(readers)
        if names is None:
            return s.filter or None
        field, named = s.readers_field, [EVERY_READER, *names]
        readable = {"$or": [{field: {"$in": named}}, *({field: {"$contains": name}} for name in named)]}
        return {"$and": [s.filter, readable]} if s.filter else readable

    def _readable_row(self, doc_id: str, document: str | None, metadata: dict | None) -> dict:
        """The row of a record, its readers ["*"] read as none named (every reader); "*" is no reader's name, and
        left in, it would hide the passage from everyone a later check asks about."""
        row, field = _row(doc_id, document, metadata), self.settings.readers_field
        value = row.get(field) if field else None
        if value == EVERY_READER or (isinstance(value, list) and EVERY_READER in value):
            row[field] = None
        elif isinstance(value, (int, float, bool)):
            raise SourceError(f"chroma metadata {field!r} (readers_field) of a record holds a number: it must be a "
                              f"list of names, one name, or [\"{EVERY_READER}\"] for every reader")
        return row

    def sample_texts(self, limit: int) -> tuple[int, list[str]]:
        """The passages the collection holds (those `filter` matches) and the embedding texts of up to `limit` of
        them, read in windows spread over the collection."""
        s = self.settings
        try:
            # Chroma counts a whole collection only: a filtered one is counted by its ids.
            count = len(self._collection.get(where=s.filter, include=[])["ids"]) if s.filter \
                else self._collection.count()
            pages = [self._collection.get(where=s.filter or None, limit=size, offset=offset,
                                          include=["documents", "metadatas"])
                     for offset, size in sample_windows(count, limit)]
        except Exception as error:  # the client's own errors, ValueError and connection errors
            raise SourceError(f"chroma {s.uri}: collection {s.collection!r} cannot be sampled "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        return count, [sample_text(s, self.name, _row(doc_id, document, metadata)) for page in pages
                       for doc_id, document, metadata in zip(page["ids"], page["documents"], page["metadatas"])]

    def change_marker(self) -> str:
        """What moves when the collection changes, as far as Chroma tells: its count (a record updated in place
        leaves it where it was; the timer catches that)."""
        return str(self._collection.count())

    def stats(self) -> SourceStats:
        return self.settings.stats(self, self.settings.collection, self._collection.count())


def _row(doc_id: str, document: str | None, metadata: dict | None) -> dict:
    """A Chroma record as the row a store's settings read: its metadata, its id and its document (as `text`)."""
    return {**(metadata or {}), "id": doc_id, "text": document}


def _reachable(uri: str, key: str | None, timeout_s: float) -> None:
    """Chroma's client makes its first requests while it is built, before its session can be bounded: the server is
    asked once here, within the timeout, so that a paused or unreachable one fails now rather than never."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    httpx.get(uri.rstrip("/") + "/api/v2/heartbeat", headers=headers, timeout=timeout_s,
              trust_env=False).raise_for_status()


def _bound(client, timeout_s: float) -> None:
    """The source's timeout on every request of the client: Chroma's own HTTP session has none (a paused server
    held a thread forever) and the client takes no option for it, so it is set on that session."""
    session = getattr(getattr(client, "_server", None), "_session", None)
    if not isinstance(session, httpx.Client):
        raise SourceError("this chromadb client keeps its HTTP session elsewhere: gradfuse cannot bound its requests "
                          "(install the chromadb version in pyproject.toml)")
    session.timeout = httpx.Timeout(timeout_s)


def _space(collection) -> str:
    """The collection's distance, from its configuration where its metadata does not name it (l2 by default)."""
    hnsw = (getattr(collection, "configuration_json", None) or {}).get("hnsw") or {}
    return hnsw.get("space") or "l2"
