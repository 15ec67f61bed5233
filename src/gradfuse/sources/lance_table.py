"""`kind = "lancedb"`: a table in a LanceDB folder or URI, read with LanceDB's own client. Vector search by the
table's own vectors (the query embedded by `query_encoder`); with `retrieval = "bm25"` its full-text index, and
with `hybrid` both fused by the same in-source RRF as every store, where the table has a full-text index (else
vector search alone). A distance is negated so that higher is better; full-text scores are BM25 already.

`readers_field` is a column of lists of text (`pa.list_(pa.string())`): a row whose list is null or empty is for
every reader of the table; a caller's search is filtered on it by LanceDB before the nearest rows are taken, and a
caller it limits gets vector search only (full-text scores count words in every row)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from gradfuse.access import Readers
from gradfuse.candidate import Candidate
from gradfuse.checked import Text
from gradfuse.sources.base import SourceError, SourceStats
from gradfuse.sources.embedded import hybrid_depth, rrf_in_source
from gradfuse.sources.stores import StoreSettings, engine_client, sample_text, sample_windows


CONSISTENCY = timedelta(seconds=5)


@dataclass(frozen=True, kw_only=True)
class LanceSettings(StoreSettings):
    table: Text


class LanceTable:
    kind = "lancedb"

    def __init__(self, name: str, settings: LanceSettings, timeout_s: float, mode: str = "hybrid"):
        lancedb = engine_client("lancedb")
        self.name, self.settings, self.mode = name, settings, mode
        try:
            # Checked for other writers' changes at most this often: without it, an open table never saw a row
            # added after it was opened (its searches and its summary's version stayed where they were).
            self._table = lancedb.connect(settings.uri, api_key=settings.key(),
                                          read_consistency_interval=CONSISTENCY).open_table(settings.table)
        except (ValueError, FileNotFoundError, OSError) as error:
            raise SourceError(f"lancedb {settings.uri}: table {settings.table!r} cannot be opened ({error})") from None
        indices = self._table.list_indices()
        self._text_index = any(index.index_type == "FTS" for index in indices)
        metric = next(((getattr(index, "index_details", None) or {}).get("metric_type") for index in indices
                       if settings.vector_field in index.columns and index.index_type != "FTS"), None)
        self._vector_kind = f"-{(metric or 'l2').lower()} distance"  # a table without a vector index: L2
        if settings.readers_field:
            _check_readers_column(self._table.schema, settings)

    def warm(self) -> None:
        self.settings.warm()

    def search(self, query: str, k: int, *, readers: Readers = None) -> list[Candidate]:
        s, lists, where = self.settings, {}, self._filter(readers)
        # LanceDB's full-text scores weigh a word by every row of the table: a caller limited to some rows is
        # answered by vector search alone, whose scores read nothing but its question and each row (docs/access.md)
        text = self._text_index and s.restricted_to(readers) is None
        if self.mode != "bm25" or not text:
            search = self._table.search(s.query_vector(query), vector_column_name=s.vector_field)
            rows = self._where(search, where).limit(hybrid_depth(k)).to_list()
            lists["dense"] = [(row, -row["_distance"]) for row in rows]
        if self.mode != "dense" and text:
            rows = self._where(self._table.search(query, query_type="fts"), where).limit(hybrid_depth(k)).to_list()
            lists["bm25"] = [(row, row["_score"]) for row in rows]
        if len(lists) == 1:
            ((name, ranked),) = lists.items()
            kind = self._vector_kind if name == "dense" else "bm25"
            return [s.candidate(self.name, rank, row, score, kind) for rank, (row, score) in enumerate(ranked[:k], 1)]
        rows = {str(s.field(row, s.id_field)): row for ranked in lists.values() for row, _ in ranked}
        fused = rrf_in_source({name: [str(s.field(row, s.id_field)) for row, _ in ranked]
                               for name, ranked in lists.items()}, k)
        candidates = []
        for rank, (key, score, ranks) in enumerate(fused, start=1):
            candidate = s.candidate(self.name, rank, rows[key], score, "rrf")
            candidate.retrieval_ranks = ranks
            candidates.append(candidate)
        return candidates

    def _filter(self, readers: Readers) -> str:
        """The SQL `where` of a search: `filter`, and where `readers` are restricted, the rows they may read."""
        s, names = self.settings, self.settings.restricted_to(readers)
        if names is None:
            return s.filter
        column = f"`{s.readers_field}`"
        readable = f"{column} IS NULL OR array_length({column}) = 0"
        if names:  # array_has_any with an empty list matches nothing: left out
            readable += f" OR array_has_any({column}, [{', '.join(_sql_text(name) for name in names)}])"
        return f"({s.filter}) AND ({readable})" if s.filter else readable

    def _where(self, search, where: str):
        """The search restricted to the rows `where` (SQL) matches, filtered before the nearest are taken."""
        return search.where(where, prefilter=True) if where else search

    def sample_texts(self, limit: int) -> tuple[int, list[str]]:
        """The rows the table holds (those `filter` matches) and the embedding texts of up to `limit` of them, read
        in windows spread over the table."""
        s = self.settings
        columns = [s.id_field, s.text_field, *([s.title_field] if s.title_field else [])]  # not the vectors
        try:
            count = self._table.count_rows(s.filter or None)
            rows = [row for offset, size in sample_windows(count, limit)
                    for row in self._where(self._table.search(), s.filter).select(columns).offset(offset)
                    .limit(size).to_list()]
        except Exception as error:  # LanceDB raises ValueError, OSError and its own errors
            raise SourceError(f"lancedb {s.uri}: table {s.table!r} cannot be sampled "
                              f"({type(error).__name__}: {str(error)[:200]})") from None
        return count, [sample_text(s, self.name, row) for row in rows]

    def change_marker(self) -> str:
        """What moves when the table changes: its version (every write makes one)."""
        return str(self._table.version)

    def stats(self) -> SourceStats:
        return self.settings.stats(self, self.settings.table, self._table.count_rows())


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_readers_column(schema, settings: LanceSettings) -> None:
    """`readers_field` names a column of lists of text: LanceDB filters nothing else as a list of readers."""
    import pyarrow as pa

    name = settings.readers_field
    if name not in schema.names:
        raise SourceError(f"lancedb table {settings.table!r} has no column {name!r} (readers_field; it has "
                          f"{', '.join(schema.names)})")
    kind = schema.field(name).type
    if not ((pa.types.is_list(kind) or pa.types.is_large_list(kind))
            and (pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type))):
        raise SourceError(f"lancedb column {name!r} (readers_field) is {kind}: it must be a list of text "
                          "(pa.list_(pa.string())), null or empty for every reader")
