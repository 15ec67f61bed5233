"""Every model of the process (the encoder, the scoring LM, generators, a cross-encoder) is loaded once, under one
lock.

Loads must not overlap: transformers builds a model's modules on the meta device and fills them from the
checkpoint, and two loads in two threads (the three source threads of a CLI search each asked for the encoder)
left the next model's tied `lm_head` on meta: `Cannot copy out of meta tensor` on the first LM query.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

LOADING = threading.RLock()  # re-entrant: a generator's load takes it again for its tokenizer
T = TypeVar("T")


def loaded_once(maxsize: int, *, transformers: bool = True) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """`functools.lru_cache`, with every call (and so every load) under LOADING: concurrent first callers wait for
    the one load instead of each loading a copy. transformers' bar of the tensors it loads is off: a load takes a
    second, and the demo printed one bar of 272 tensors a model. `transformers=False`: a loader that imports
    transformers only later, if at all (the encoder), quiets it itself."""

    def decorate(load: Callable[..., T]) -> Callable[..., T]:
        cached = functools.lru_cache(maxsize=maxsize)(load)

        @functools.wraps(load)
        def once(*args, **kwargs) -> T:
            with LOADING:
                if transformers:
                    quiet_transformers()
                return cached(*args, **kwargs)

        once.cache_clear = cached.cache_clear
        return once

    return decorate


@functools.cache
def quiet_transformers() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()


def check_materialised(model, where: str):
    """`model`, with a tied output layer that a load left on the meta device tied again; any other parameter still
    on meta is an error naming it (a model that would fail at its first pass)."""
    head = getattr(model, "lm_head", None)
    if getattr(model.config, "tie_word_embeddings", False) and head is not None and head.weight.is_meta:
        head.weight = model.get_input_embeddings().weight
    missing = [name for name, parameter in model.named_parameters() if parameter.is_meta]
    if missing:
        raise RuntimeError(f"{where}: weights {', '.join(missing[:3])} were not loaded (left on the meta device)")
    return model


def user_cache() -> Path:
    """Where converted copies of models are kept across workspaces: GRADFUSE_CACHE, default ~/.cache/gradfuse."""
    return Path(os.environ.get("GRADFUSE_CACHE") or Path.home() / ".cache" / "gradfuse")
