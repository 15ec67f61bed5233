"""`kind = "qdrant"`: a Qdrant collection, read with `qdrant-client`, on a server (`uri = "http://host:6333"`,
its key from `key_env`) or in a local folder (`uri = "/path"`: the client's own embedded mode, which is not the
Qdrant server, and which one process at a time may open). The query is embedded by `query_encoder`; a point's id
is `id_field` of its payload where it has one, else the point's own id. Cosine and dot scores are similarities;
Euclid and Manhattan scores are distances, negated so that higher is better.

`readers_field` is a payload key holding a list of names (or one name); a point without it, or with null or an
empty list, is for every reader of the collection. A caller's search is filtered on it inside Qdrant (a keyword
payload index on the key keeps that filter fast on a large collection)."""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import ClassVar

from gradfuse.access import Readers
from gradfuse.candidate import Candidate
from gradfuse.checked import Text
from gradfuse.sources.base import SourceError, SourceStats
from gradfuse.sources.stores import StoreSettings, engine_client, sample_text

_DISTANCES = ("Euclid", "Manhattan")  # lower is closer


@dataclass(frozen=True, kw_only=True)
class QdrantSettings(StoreSettings):
    collection: Text
    vector_field: Text = ""  # a named vector of the collection ("": its one unnamed vector)
    filter_type: ClassVar[type] = dict  # a Qdrant filter: {must = [{key = "lang", match = {value = "en"}}]}


class QdrantCollection:
    kind = "qdrant"

    def __init__(self, name: str, settings: QdrantSettings, timeout_s: float, mode: str = "dense"):
        QdrantClient = engine_client("qdrant_client", "QdrantClient")

        self.name, self.settings, self.mode = name, settings, "dense"  # vector search: Qdrant keeps no BM25 here
        self._remote = settings.uri.startswith(("http://", "https://"))
        self._client = QdrantClient(url=settings.uri, api_key=settings.key(), timeout=max(1, int(timeout_s))) \
            if self._remote else _local_client(settings.uri)
        try:
            params = self._client.get_collection(settings.collection).config.params.vectors
        except Exception as error:  # the client raises ValueError locally, its own errors from a server
            self.close()
            raise SourceError(f"qdrant {settings.uri}: collection {settings.collection!r} cannot be read "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        if isinstance(params, dict):
            if settings.vector_field not in params:
                self.close()
                raise SourceError(f"qdrant collection {settings.collection!r} has no vector named "
                                  f"{settings.vector_field!r} (it has {', '.join(params)})")
            params = params[settings.vector_field]
        distance = str(getattr(params.distance, "value", params.distance))
        self._sign = -1.0 if distance in _DISTANCES else 1.0
        self._score_kind = f"{'-' if self._sign < 0 else ''}{distance.lower()}"
        try:
            self._filter = engine_client("qdrant_client.models", "Filter").model_validate(settings.filter) \
                if settings.filter else None
        except ValueError as error:  # pydantic's ValidationError: the table is no Qdrant filter
            self.close()
            raise SourceError(f"qdrant: filter is not a Qdrant filter ({str(error)[:300]})") from None
        if settings.readers_field:
            self._check_readers_field()

    def _check_readers_field(self) -> None:
        """Refuse a `readers_field` no point `filter` keeps holds (a misspelt key would leave every point open to
        every reader), unless it keeps none."""
        models, s = engine_client("qdrant_client", "models"), self.settings
        held = models.Filter(must_not=[models.IsEmptyCondition(is_empty=models.PayloadField(key=s.readers_field))])
        try:
            restricted = self._client.count(s.collection, exact=True, count_filter=models.Filter(
                must=[held, self._filter] if self._filter else [held])).count
            kept = self._client.count(s.collection, count_filter=self._filter, exact=True).count
        except Exception as error:  # the client raises ValueError locally, its own errors from a server
            self.close()
            raise SourceError(f"qdrant {s.uri}: collection {s.collection!r} cannot be counted "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        if restricted == 0 and kept > 0:
            self.close()
            raise SourceError(f"qdrant collection {s.collection!r}: no point holds readers_field "
                              f"{s.readers_field!r}, so none would be restricted (check the key's spelling; a "
                              "collection whose points are all for every reader needs no readers_field)")

    def warm(self) -> None:
        self.settings.warm()

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        s = self.settings
        found = self._client.query_points(s.collection, query=s.query_vector(query), using=s.vector_field or None,
                                          limit=k, with_payload=True, query_filter=self._query_filter(readers)).points
        return [s.candidate(self.name, rank, self._row(point), self._sign * point.score, self._score_kind)
                for rank, point in enumerate(found, start=1)]

    def _query_filter(self, readers: Readers):
        """`filter`, and where `readers` are restricted, the points they may read: both must hold."""
        names = self.settings.restricted_to(readers)
        if names is None:
            return self._filter
        models = engine_client("qdrant_client", "models")
        key = self.settings.readers_field
        readable = [models.IsEmptyCondition(is_empty=models.PayloadField(key=key))]  # missing, null or []
        if names:
            readable.append(models.FieldCondition(key=key, match=models.MatchAny(any=names)))
        only_readable = models.Filter(should=readable)
        return models.Filter(must=[self._filter, only_readable]) if self._filter else only_readable

    def _row(self, point) -> dict:
        """A point as the row the settings read: its payload, its own id where the payload has no `id_field`."""
        return {self.settings.id_field: point.id, **(point.payload or {})}

    def sample_texts(self, limit: int) -> tuple[int, list[str]]:
        """The points the collection holds (those `filter` matches) and the embedding texts of up to `limit` of
        them, drawn at random by Qdrant over the whole collection."""
        s, models = self.settings, engine_client("qdrant_client", "models")
        try:
            count = self._client.count(s.collection, count_filter=self._filter, exact=True).count
            points = self._client.query_points(s.collection, query=models.SampleQuery(sample=models.Sample.RANDOM),
                                               limit=limit, with_payload=True, query_filter=self._filter).points
        except Exception as error:  # the client raises ValueError locally, its own errors from a server
            raise SourceError(f"qdrant {s.uri}: collection {s.collection!r} cannot be sampled "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        return count, [sample_text(s, self.name, self._row(point)) for point in points]

    def change_marker(self) -> str:
        """What moves when the collection changes, as far as Qdrant tells: its count (a point updated in place
        leaves it where it was; the timer catches that)."""
        return str(self._client.count(self.settings.collection, exact=True).count)

    def stats(self) -> SourceStats:
        count = self._client.count(self.settings.collection, exact=True).count
        return self.settings.stats(self, self.settings.collection, count)

    def close(self) -> None:
        if self._remote:  # a local folder's client stays open for the process: it may open the folder once
            self._client.close()


_LOCAL: dict[str, object] = {}
_LOCAL_LOCK = threading.Lock()


def _local_client(path: str):
    """One client per local folder in this process (the embedded mode locks its folder), closed at exit."""
    QdrantClient = engine_client("qdrant_client", "QdrantClient")
    with _LOCAL_LOCK:
        if path not in _LOCAL:
            try:
                _LOCAL[path] = QdrantClient(path=path)
            except RuntimeError as error:  # another process (or client) holds the folder
                raise SourceError(f"qdrant folder {path} cannot be opened ({error})") from None
            atexit.register(_LOCAL[path].close)
        return _LOCAL[path]
