"""`kind = "milvus"`: a Milvus collection through pymilvus' `MilvusClient`, on a server (`uri =
"http://host:19530"`, a token from `key_env`) or a Milvus Lite file (`uri = "/path/milvus.db"`: the real engine,
embedded). The query is embedded by `query_encoder` and searched on `vector_field`; the id, text and title are the
fields named. COSINE and IP scores are similarities; an L2 (or other distance) score is negated so that higher is
better, as the index on `vector_field` says its metric. A released collection is loaded when the source opens:
Milvus searches loaded collections only.

`readers_field` is a field the collection's schema declares as an ARRAY of VARCHAR (`nullable=True` to allow
null): a row whose array is null or empty is for every reader. A key of the dynamic field is refused: Milvus Lite's
`array_length` of a text there is 0, which would open that row to everyone."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gradfuse.access import Readers
from gradfuse.candidate import Candidate
from gradfuse.checked import Text
from gradfuse.sources.base import SourceError, SourceStats
from gradfuse.sources.stores import StoreSettings, engine_client, sample_text, sample_windows

_SIMILARITIES = ("COSINE", "IP")
_QUERY_WINDOW = 16_384  # Milvus answers a query only within its first rows (offset + limit, max_query_result_window)


@dataclass(frozen=True, kw_only=True)
class MilvusSettings(StoreSettings):
    collection: Text


class MilvusCollection:
    kind = "milvus"

    def __init__(self, name: str, settings: MilvusSettings, timeout_s: float, mode: str = "dense"):
        MilvusClient = engine_client("pymilvus", "MilvusClient")
        self.name, self.settings, self.mode, self._timeout = name, settings, "dense", timeout_s  # vector search
        key = settings.key()
        try:
            self._client = MilvusClient(settings.uri, **({"token": key} if key else {}), timeout=timeout_s)
            indexes = [self._client.describe_index(settings.collection, index)
                       for index in self._client.list_indexes(settings.collection)]
            # Milvus searches only a loaded collection, and one reopened (a Lite file, a restarted server) or
            # released by its owner is not: load it, as any reader must.
            if str(self._client.get_load_state(settings.collection)["state"]) != "Loaded":
                self._client.load_collection(settings.collection, timeout=timeout_s)
            fields = self._client.describe_collection(settings.collection)["fields"] if settings.readers_field else []
        except Exception as error:  # pymilvus raises its own exceptions for a missing collection or server
            raise SourceError(f"milvus {settings.uri}: collection {settings.collection!r} cannot be read "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        metric = next((i.get("metric_type") for i in indexes if i.get("field_name") == settings.vector_field), None)
        if metric is None:
            raise SourceError(f"milvus collection {settings.collection!r} has no vector index on "
                              f"{settings.vector_field!r} (vector_field)")
        self._sign = 1.0 if str(metric).upper() in _SIMILARITIES else -1.0
        self._score_kind = f"{'' if self._sign > 0 else '-'}{str(metric).lower()}"
        if settings.readers_field:
            _check_readers_field(fields, settings)

    def warm(self) -> None:
        self.settings.warm()

    def _fields(self) -> list[str]:
        s = self.settings
        return [s.id_field, s.text_field, *([s.title_field] if s.title_field else []), *s.metadata_fields]

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        s = self.settings
        fields = self._fields() + ([s.readers_field] if s.readers_field else [])  # Candidate.readers reads it
        (hits,) = self._client.search(s.collection, data=[s.query_vector(query)], limit=k, anns_field=s.vector_field,
                                      output_fields=fields, filter=self._filter(readers), timeout=self._timeout)
        return [s.candidate(self.name, rank, {s.id_field: hit["id"], **hit["entity"]}, self._sign * hit["distance"],
                            self._score_kind)
                for rank, hit in enumerate(hits, start=1)]

    def _filter(self, readers: Readers) -> str:
        """The boolean expression of a search: `filter`, and where `readers` are restricted, the rows they may
        read."""
        s, names = self.settings, self.settings.restricted_to(readers)
        if names is None:
            return s.filter
        field = s.readers_field
        readable = f"{field} is null or array_length({field}) == 0"
        if names:  # JSON's quoting is the expression's: double-quoted, backslash escapes
            readable += f" or array_contains_any({field}, {json.dumps(names)})"
        return f"({s.filter}) and ({readable})" if s.filter else readable

    def sample_texts(self, limit: int) -> tuple[int, list[str]]:
        """The rows the collection holds (those `filter` matches) and the embedding texts of up to `limit` of them,
        read in windows spread over its first 16,384 rows (Milvus Lite draws no random sample)."""
        s = self.settings
        try:
            (counted,) = self._client.query(s.collection, filter=s.filter, output_fields=["count(*)"],
                                            timeout=self._timeout)
            rows = [row for offset, size in sample_windows(min(counted["count(*)"], _QUERY_WINDOW), limit)
                    for row in self._client.query(s.collection, filter=s.filter, output_fields=self._fields(),
                                                  limit=size, offset=offset, timeout=self._timeout)]
        except Exception as error:  # pymilvus raises its own exceptions
            raise SourceError(f"milvus {s.uri}: collection {s.collection!r} cannot be sampled "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        return counted["count(*)"], [sample_text(s, self.name, row) for row in rows]

    def change_marker(self) -> str:
        """What moves when the collection changes, as far as Milvus tells: its count (a row updated in place
        leaves it where it was; the timer catches that)."""
        (counted,) = self._client.query(self.settings.collection, filter="", output_fields=["count(*)"],
                                        timeout=self._timeout)
        return str(counted["count(*)"])

    def stats(self) -> SourceStats:
        rows = int(self._client.get_collection_stats(self.settings.collection).get("row_count", 0))
        return self.settings.stats(self, self.settings.collection, rows)

    def close(self) -> None:
        self._client.close()


def _check_readers_field(fields: list[dict], settings: MilvusSettings) -> None:
    """`readers_field` is declared in the schema as an ARRAY of VARCHAR: Milvus then keeps every row's value a list
    of texts (or null), which is all the readers' expression can be trusted on."""
    field = next((f for f in fields if f.get("name") == settings.readers_field), None)
    if field is None:
        raise SourceError(f"milvus collection {settings.collection!r} declares no field {settings.readers_field!r} "
                          "(readers_field): declare it in the schema as an ARRAY of VARCHAR (nullable=True to "
                          "allow null), not as a key of the dynamic field")
    DataType = engine_client("pymilvus", "DataType")
    kind, element = field.get("type"), field.get("element_type")
    if kind != DataType.ARRAY or element != DataType.VARCHAR:
        shown = f"{getattr(kind, 'name', kind)}" + (f" of {getattr(element, 'name', element)}" if element else "")
        raise SourceError(f"milvus field {settings.readers_field!r} (readers_field) is {shown}: it must be an ARRAY "
                          "of VARCHAR")
