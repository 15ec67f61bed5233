"""What every vector store kind reads alike (`chroma`, `milvus`, `qdrant`, `lancedb`): where the store is, which
fields hold the id, text, title and vector, how the query is embedded for it (its own model: not
necessarily gradfuse's encoder), and its key only by the name of an environment variable. One file per kind
reads it with the engine's own client; here is the part they share."""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gradfuse.access import Readers, check_reader
from gradfuse.candidate import Candidate
from gradfuse.checked import FILE_SETTINGS, LOOPBACK, Text
from gradfuse.sources.base import SourceError, SourceStats
from gradfuse.embedding.encoder import DEFAULT_ENCODER, embedding_text

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_address(address: str, field: str, key_env: str) -> None:
    """An engine's address holds no credentials (they would end up in a file), `key_env` names a variable, and a
    key goes over plain http only to this machine (as the generator's)."""
    parts = urlsplit(address)
    if parts.username or parts.password:
        raise ValueError(f"{field} must not carry credentials (they would end up in a file): put the key in an "
                         "environment variable and name it with key_env")
    if key_env and not _VARIABLE.fullmatch(key_env):
        raise ValueError(f"key_env {key_env!r} must be the name of an environment variable")
    if key_env and parts.scheme == "http" and parts.hostname not in LOOPBACK:
        raise ValueError(f"refusing to send {key_env} over plain http to {parts.hostname}: use https, or an "
                         "address on this machine")


def relative_to(table: dict[str, Any], base: Path) -> dict[str, Any]:
    """A store's folder or file (`uri` without a scheme) and a model folder (`query_encoder` other than the
    bundled one) named by a relative path are relative to the file that names them (`base` its folder)."""
    table = dict(table)
    uri, encoder = table.get("uri"), table.get("query_encoder")
    if isinstance(uri, str) and uri and "://" not in uri and not Path(uri).expanduser().is_absolute():
        table["uri"] = os.path.normpath(base / uri)
    if isinstance(encoder, str) and encoder.partition("@")[0] != DEFAULT_ENCODER \
            and not Path(encoder).expanduser().is_absolute():
        table["query_encoder"] = os.path.normpath(base / encoder)
    return table


def key_from(key_env: str, what: str) -> str | None:
    """The key in the variable `key_env` names (None where it names none); an unset variable is the source's
    failure."""
    if not key_env:
        return None
    value = os.environ.get(key_env)
    if not value:
        raise SourceError(f"environment variable {key_env} ({what}) is not set")
    return value


def engine_client(module: str, attribute: str | None = None):
    """An engine's client library (an optional dependency), or the failure that says how to install it."""
    try:
        imported = importlib.import_module(module)
    except ImportError:
        raise SourceError(f"this source needs {module}: pip install 'gradfuse[engines]'") from None
    return getattr(imported, attribute) if attribute else imported


def _plain(value):
    """A metadata value as JSON holds it: text, numbers, booleans and lists of them; anything else as text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


@dataclass(frozen=True, kw_only=True)
class StoreSettings:
    __pydantic_config__ = FILE_SETTINGS
    uri: Text  # a folder, a file, or a server URL, as the engine takes it
    id_field: Text = "id"
    text_field: Text = "text"
    title_field: Text = ""  # "": no title
    vector_field: Text = "vector"
    metadata_fields: tuple[Text, ...] = ()  # fields kept with each passage (Candidate.metadata)
    # Only rows this matches, in the engine's own filter language: a LanceDB SQL `where`, a Milvus boolean
    # expression, a Chroma `where` table, a Qdrant filter table ({must = [{key = ..., match = {value = ...}}]}).
    filter: str | dict[str, Any] = ""
    query_encoder: Text = "all-MiniLM-L6-v2"  # the model that embedded the store: bundled by name, or a local folder
    key_env: Text = ""  # the variable holding the engine's key or token, if any
    # The field that lists who may read a row (principals' names and groups; docs/access.md): each search is
    # filtered on it inside the engine. A row without it, or with an empty list, is for every reader of the source.
    readers_field: Text = ""

    filter_type: ClassVar[type] = str  # what `filter` is in this engine's language: text, or a table (dict)

    def __post_init__(self):
        check_address(self.uri, "uri", self.key_env)
        if self.filter and not isinstance(self.filter, self.filter_type):
            raise ValueError(f"filter must be {'a table' if self.filter_type is dict else 'text'} for this kind")

    def key(self) -> str | None:
        return key_from(self.key_env, "the engine's key")

    def query_vector(self, query: str) -> list[float]:
        """The query embedded by the store's own model (loaded once per process)."""
        from gradfuse.embedding.encoder import load_encoder

        return load_encoder(self.query_encoder).encode_query(query).tolist()

    def warm(self) -> None:
        from gradfuse.embedding.encoder import load_encoder

        load_encoder(self.query_encoder)

    def field(self, row: dict, name: str):
        """A row's field, or the failure that says which field it lacks and what it holds."""
        try:
            return row[name]
        except KeyError:
            raise SourceError(f"a row has no field {name!r} (id_field {self.id_field!r}, text_field "
                              f"{self.text_field!r}; it holds {', '.join(sorted(map(str, row)))})") from None

    def candidate(self, source: str, rank: int, row: dict, score: float, score_kind: str) -> Candidate:
        """A store's row as a passage; `score` higher is better (a distance is negated by the caller, and
        `score_kind` says so: "-l2" is a negated L2 distance)."""
        doc_id, text = self.field(row, self.id_field), self.field(row, self.text_field)
        if not isinstance(text, str):
            raise SourceError(f"field {self.text_field!r} holds {type(text).__name__}, not text")
        if doc_id is None or isinstance(doc_id, (dict, list)):
            raise SourceError(f"field {self.id_field!r} holds {type(doc_id).__name__}, not an id")
        title = row.get(self.title_field) if self.title_field else ""
        return Candidate(source=source, doc_id=str(doc_id), text=text, native_score=float(score), native_rank=rank,
                         title=str(title or ""), score_kind=score_kind,
                         metadata={name: _plain(row[name]) for name in self.metadata_fields if name in row},
                         readers=self.row_readers(row))

    def row_readers(self, row: dict) -> tuple[str, ...]:
        """Who may read a row, from `readers_field` (a list of names, or one name); () where it names none. A
        dotted field is a nested key where the row has no key of that name (Qdrant's payload paths)."""
        value = row.get(self.readers_field) if self.readers_field else None
        if value is None and "." in self.readers_field:
            value = row
            for part in self.readers_field.split("."):
                value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
            return tuple(value)
        raise SourceError(f"field {self.readers_field!r} (readers_field) of a row holds {type(value).__name__}: it "
                          "must list the names that may read the row (a list of texts)")

    def restricted_to(self, readers: Readers) -> list[str] | None:
        """The names a search is restricted to (checked again, sorted: the same filter text for the same caller),
        or None where it is not restricted: the caller reads every document, or the store names no readers."""
        if readers is None or not self.readers_field:
            return None
        return sorted(check_reader(name) for name in readers)

    def stats(self, source, where: str, documents: int) -> SourceStats:
        """A store source's row in `gradfuse sources`: `where` is its table or collection."""
        return SourceStats(name=source.name, kind=source.kind, documents=documents, index_bytes=None,
                           encoder=self.query_encoder, built_at="-", input=f"{self.uri} · {where}",
                           retrieval=source.mode)


SAMPLE_WINDOWS = 8  # reads of consecutive rows that make a sample: few requests, still spread over the collection


def sample_windows(count: int, limit: int) -> list[tuple[int, int]]:
    """(offset, size) of at most SAMPLE_WINDOWS runs of rows, min(count, limit) rows in all, spread evenly over
    `count` rows (the rows left out are spread between them): engines that read by offset sample this way."""
    wanted = min(count, limit)
    if wanted == count:
        return [(0, count)] if count else []
    skipped = count - wanted
    windows = [(i * wanted // SAMPLE_WINDOWS + i * skipped // SAMPLE_WINDOWS,
                (i + 1) * wanted // SAMPLE_WINDOWS - i * wanted // SAMPLE_WINDOWS) for i in range(SAMPLE_WINDOWS)]
    return [(offset, size) for offset, size in windows if size]


def sample_text(settings: StoreSettings, source: str, row: dict) -> str:
    """A store's row as the text its passage is embedded as, its text and title read as `search` reads them."""
    passage = settings.candidate(source, 0, row, 0.0, "")
    return embedding_text(passage.title, passage.text)
