"""Sources that an engine serves in place (nothing is copied into gradfuse): each kind's settings and its source,
one file per kind. `[sources.NAME] kind = "<kind>"` in gradfuse.toml declares one; what it answers is not kept
in the server's result cache (the engine's data changes without a publish here)."""

from __future__ import annotations

from gradfuse.sources.base import Source
from gradfuse.sources.gradfuse_remote import RemoteGradfuse, RemoteSettings

ENGINE_KINDS = {"gradfuse": (RemoteSettings, RemoteGradfuse)}


def open_engine(name: str, settings, timeout_s: float) -> Source:
    """The source for `settings` (one of ENGINE_KINDS' settings types)."""
    source_type = next(source for settings_type, source in ENGINE_KINDS.values() if isinstance(settings, settings_type))
    return source_type(name, settings, timeout_s)
