"""Sources that an engine serves in place (nothing is copied into gradfuse): each kind's settings and its source,
one file per kind. `[sources.NAME] kind = "<kind>"` in gradfuse.toml declares one; what it answers is not kept
in the server's result cache (the engine's data changes without a publish here)."""

from __future__ import annotations

from gradfuse.sources.base import Source
from gradfuse.sources.chroma_collection import ChromaCollection, ChromaSettings
from gradfuse.sources.gradfuse_remote import RemoteGradfuse, RemoteSettings
from gradfuse.sources.lance_table import LanceSettings, LanceTable
from gradfuse.sources.milvus_collection import MilvusCollection, MilvusSettings
from gradfuse.sources.qdrant_collection import QdrantCollection, QdrantSettings

ENGINE_KINDS = {"gradfuse": (RemoteSettings, RemoteGradfuse), "lancedb": (LanceSettings, LanceTable),
                "qdrant": (QdrantSettings, QdrantCollection), "chroma": (ChromaSettings, ChromaCollection),
                "milvus": (MilvusSettings, MilvusCollection)}


def engine_kind(settings) -> str:
    """The kind (a key of ENGINE_KINDS) whose settings type `settings` is."""
    return next(kind for kind, (settings_type, _) in ENGINE_KINDS.items() if isinstance(settings, settings_type))


def open_engine(name: str, settings, timeout_s: float, mode: str) -> Source:
    """The source for `settings` (one of ENGINE_KINDS' settings types), with `mode` its retrieval (bm25, dense or
    hybrid) where the engine has more than one."""
    _, source_type = ENGINE_KINDS[engine_kind(settings)]
    return source_type(name, settings, timeout_s, mode)
