"""Sources that an engine serves in place (nothing is copied into gradfuse): each kind's settings and its source,
one file per kind. `[sources.NAME] kind = "<kind>"` in gradfuse.toml declares one; what it answers is not kept
in the server's result cache (the engine's data changes without a publish here)."""

from __future__ import annotations

from importlib import import_module

from gradfuse.sources.base import Source

# kind → (its module in gradfuse.sources, its settings type, its source type). A kind's module, and with it the
# engine's client, is imported when a source of that kind is declared or opened (issue 71: every command paid for
# every engine's import).
ENGINE_KINDS = {"gradfuse": ("gradfuse_remote", "RemoteSettings", "RemoteGradfuse"),
                "lancedb": ("lance_table", "LanceSettings", "LanceTable"),
                "qdrant": ("qdrant_collection", "QdrantSettings", "QdrantCollection"),
                "chroma": ("chroma_collection", "ChromaSettings", "ChromaCollection"),
                "milvus": ("milvus_collection", "MilvusSettings", "MilvusCollection")}


def engine_types(kind: str) -> tuple[type, type]:
    """(settings type, source type) of `kind`, a key of ENGINE_KINDS."""
    module, settings_type, source_type = ENGINE_KINDS[kind]
    loaded = import_module(f"gradfuse.sources.{module}")
    return getattr(loaded, settings_type), getattr(loaded, source_type)


def engine_kind(settings) -> str:
    """The kind (a key of ENGINE_KINDS) whose settings type `settings` is."""
    named = (type(settings).__module__, type(settings).__name__)
    return next(kind for kind, (module, settings_type, _) in ENGINE_KINDS.items()
                if named == (f"gradfuse.sources.{module}", settings_type))


def open_engine(name: str, settings, timeout_s: float, mode: str) -> Source:
    """The source for `settings` (one of ENGINE_KINDS' settings types), with `mode` its retrieval (bm25, dense or
    hybrid) where the engine has more than one."""
    _, source_type = engine_types(engine_kind(settings))
    return source_type(name, settings, timeout_s, mode)
