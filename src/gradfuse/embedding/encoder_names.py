"""How an encoder is named: a model and its precision (`all-MiniLM-L6-v2@float32`). The spelled-out name keys the
embedding cache and an index's fingerprint, so that vectors of two precisions never mix."""

from __future__ import annotations

PRECISIONS = ("float32", "bfloat16")
DEFAULT_PRECISION = "float32"


def encoder_name(name: str) -> str:
    """`name` with its precision spelled out (`all-MiniLM-L6-v2` → `all-MiniLM-L6-v2@float32`): what keys the
    embedding cache and an index's fingerprint, so that vectors of two precisions never mix."""
    model, _, precision = name.partition("@")
    precision = precision or DEFAULT_PRECISION
    if precision not in PRECISIONS:
        raise ValueError(f"encoder {name!r}: unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    return f"{model}@{precision}"


def recorded_encoder(name: str) -> str:
    """The encoder an index or table records, spelled out: before float32 was the default, a bare model name meant
    its bfloat16 vectors."""
    return name if "@" in name else f"{name}@bfloat16"
