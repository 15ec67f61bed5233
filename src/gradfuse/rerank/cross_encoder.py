"""A cross-encoder from a local folder, through sentence-transformers' CrossEncoder. No cross-encoder's weights
ship in a wheel here, so the method runs only where `[rerank] cross_encoder` names a folder."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from gradfuse.loading import loaded_once
from gradfuse.rerank.base import RerankSettings, Scored


class CrossEncoderMissing(ValueError):
    pass


class CrossEncoderScorer:
    name = "cross-encoder"

    def __init__(self, folder: str):
        self.model = load_cross_encoder(folder)
        self._lock = threading.Lock()

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        with self._lock:
            values = self.model.predict([(question, doc) for doc in docs], show_progress_bar=False)
        return Scored({"cross_encoder": np.asarray(values, dtype=float).reshape(len(docs))}, "cross_encoder")


@loaded_once(maxsize=2)
def load_cross_encoder(folder: str):
    if not folder:
        raise CrossEncoderMissing("the cross-encoder method needs a model: set [rerank] cross_encoder to a local "
                                  "sentence-transformers CrossEncoder folder (none ships with gradfuse)")
    if not (Path(folder) / "config.json").is_file():
        raise CrossEncoderMissing(f"[rerank] cross_encoder: {folder} is not a folder with a model's config.json")
    from sentence_transformers import CrossEncoder

    return CrossEncoder(folder, local_files_only=True)
