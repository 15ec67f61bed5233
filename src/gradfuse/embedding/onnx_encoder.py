"""The encoder's ONNX copy, which embeds passages and queries in a process that never imports torch.

A cold `gradfuse search` spent 6 s importing sentence-transformers (torch, transformers, scikit-learn) and 1-3 s
loading the model, to embed one query; onnxruntime and tokenizers take about 0.5 s for the same. Passages too: on
128 SciFact abstracts ONNX Runtime embedded 23–29 passages per CPU-second in float32, torch 11 in float32 and
22.5–25.5 in bf16 where the CPU has bf16 instructions, 3.7 where it emulates them (make bench-indexing). The copy
is exported from the same weights (torch.onnx) the first time the torch model loads (the first build, or a query
before any build), and kept under GRADFUSE_CACHE (default ~/.cache/gradfuse) by the weights' path, size and time.
It runs in float32: its vectors are within 2e-7 of the torch float32 model's, so the two are one encoder
(`model@float32`) and an index never holds vectors of two precisions. Models other than a transformer with mean
or CLS pooling have no copy and embed with sentence-transformers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import warnings
from pathlib import Path

import numpy as np

from gradfuse.loading import user_cache

log = logging.getLogger(__name__)
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BATCH_TOKENS = 512  # tokens a pass, padding included


def onnx_file(model_path: Path) -> Path:
    weights = max(model_path.glob("*.safetensors"), default=None) or max(model_path.glob("*.bin"), default=None)
    stat = (weights or model_path / "config.json").stat()
    key = hashlib.sha256(f"{model_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return user_cache() / "encoders" / f"{'-'.join(model_path.parts[-2:])}-{key}.onnx"


def _pooling(model_path: Path) -> str | None:
    """mean or cls where the model is a transformer, that pooling and at most a normalisation; else None."""
    try:
        modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((model_path / "modules.json").read_text())]
        pooling = json.loads(next(model_path.glob("*_Pooling/config.json")).read_text())
    except (OSError, ValueError, KeyError, StopIteration):
        return None
    if modules[:2] != ["Transformer", "Pooling"] or set(modules[2:]) - {"Normalize"}:
        return None
    modes = {mode for mode in ("mean_tokens", "cls_token", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                               "lasttoken") if pooling.get(f"pooling_mode_{mode}")}
    return {frozenset({"mean_tokens"}): "mean", frozenset({"cls_token"}): "cls"}.get(frozenset(modes))


def export(model, model_path: Path) -> None:
    """Write the ONNX copy of a sentence-transformers `model` just loaded (float32, on the CPU: before any cast to
    bf16, whose rounded weights would not be the model's) where `onnx_file` says, once; a failure is logged and
    queries go on through torch."""
    target = onnx_file(model_path)
    if target.is_file() or _pooling(model_path) is None:
        return
    import torch

    transformer = model[0].auto_model
    names = [n for n in _INPUTS if n in model.tokenizer.model_input_names]

    class LastHidden(torch.nn.Module):  # the transformer's output alone, inputs by name (forward's order varies)
        def __init__(self):
            super().__init__()
            self.transformer = transformer

        def forward(self, *inputs):
            return self.transformer(**dict(zip(names, inputs))).last_hidden_state

    sample = model.tokenizer(["a query", "a longer second query"], padding=True, return_tensors="pt")
    staging = target.with_name(f"{target.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on transformers' code, not the user's concern
            torch.onnx.export(LastHidden(), tuple(sample[n] for n in names), staging, input_names=names,
                              output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                              dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]})
        os.replace(staging, target)  # whole, so a crash mid-export leaves no half copy in use
    except Exception as error:  # noqa: BLE001 - the torch path still embeds every query
        log.warning("no ONNX copy of the encoder %s (queries load torch instead): %s: %s", model_path.name,
                    type(error).__name__, error)
        staging.unlink(missing_ok=True)


class OnnxEncoder:
    """Texts tokenised as sentence-transformers does (truncated at the model's max_seq_length), pooled and
    L2-normalised."""

    def __init__(self, path: Path, model_path: Path, pooling: str):
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = min(os.cpu_count() or 1, 4)  # one short query: more threads only wait
        # Threads that wait for work sleep instead of spinning: on a busy machine spinning threads took the cores
        # from the process that had the work.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(_max_tokens(model_path))
        self._pooling = pooling

    @classmethod
    def open(cls, model_path: Path) -> OnnxEncoder | None:
        """The copy where it was exported and the model's tokenizer can be read; None otherwise."""
        path, pooling = onnx_file(model_path), _pooling(model_path)
        if pooling is None or not path.is_file() or not (model_path / "tokenizer.json").is_file():
            return None
        try:
            return cls(path, model_path, pooling)
        except Exception as error:  # noqa: BLE001 - a damaged copy: torch embeds the queries
            log.warning("the ONNX copy of the encoder %s cannot be opened (queries load torch instead): %s",
                        model_path.name, error)
            return None

    def encode(self, texts: list[str]) -> np.ndarray:
        """L2-normalised vectors of `texts`, in batches of similar length
        (sorted, and cut where padding to the longest would pass BATCH_TOKENS), so that little of a batch is
        padding: one 138-token row padded a batch of sixteen short sentences to nine times their length."""
        encodings = self._tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        batches, batch = [], []
        for i in order:
            if batch and (len(batch) + 1) * len(encodings[i].ids) > BATCH_TOKENS:
                batches.append(batch)
                batch = []
            batch.append(i)
        batches.append(batch)
        vectors = None
        for rows in batches:
            pooled = self._encode([encodings[i] for i in rows])
            vectors = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32) if vectors is None else vectors
            vectors[rows] = pooled
        return vectors

    def _encode(self, encodings) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        feeds = {name: np.zeros((len(encodings), width), dtype=np.int64) for name in _INPUTS}
        for row, e in enumerate(encodings):
            for name, values in zip(_INPUTS, (e.ids, e.attention_mask, e.type_ids)):
                feeds[name][row, : len(values)] = values
        hidden = self._session.run(None, {name: feeds[name] for name in self._inputs})[0]
        if self._pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = feeds["attention_mask"][..., None].astype(hidden.dtype)
            pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return (pooled / norms).astype(np.float32)


def _max_tokens(model_path: Path) -> int:
    try:
        return int(json.loads((model_path / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, ValueError, KeyError):
        return 512
