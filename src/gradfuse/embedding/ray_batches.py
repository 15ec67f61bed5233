"""A build's passages embedded on a Ray cluster (`gradfuse index ... --ray ADDRESS`, `[build] ray_address`).

Embedding is the one step of a build that costs (28-42 passages a second on two cores, results/indexing): the
batches the embedding cache is missing go out as Ray tasks, as many in flight as the cluster has CPUs (or GPUs),
and come back to the driver, which writes each into the workspace's embedding cache as it arrives, so a build that
stops keeps what was embedded. A task whose worker or node is lost is run again elsewhere by Ray (`max_retries`).
A task loads the encoder once per worker process and embeds as a local build does (the same model, the same
batches), on its GPU where the cluster has GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gradfuse.ray_cluster import RayUnavailable, connect

RETRIES = 5  # a batch whose worker died is run again this often before the build fails


@dataclass(frozen=True)
class BuildSettings:
    """`[build]`: where a build's embedding runs ("": in this process; a Ray address: on that cluster)."""

    ray_address: str = ""


def embed_batch(encoder: str, texts: list[str]) -> np.ndarray:
    """One batch's vectors, in a Ray worker (the encoder is loaded once per worker process: load_encoder)."""
    import ray

    from gradfuse.embedding.encoder import load_encoder

    if ray.get_gpu_ids():
        return _on_gpu(encoder, texts)
    return load_encoder(encoder).encode(texts)


def _on_gpu(encoder: str, texts: list[str]) -> np.ndarray:
    """The batch by torch on the worker's GPU, in the encoder's precision."""
    import torch

    from gradfuse.embedding.encoder import load_gpu_model

    model = load_gpu_model(encoder)
    with torch.inference_mode():
        vectors = model.encode(texts, batch_size=len(texts), normalize_embeddings=True, convert_to_numpy=True)
    return vectors.astype(np.float32)


class RayBatches:
    """Embeds batches on the cluster at `address` (connected while it is open, a context manager); called with
    the batches' texts, yields (index, vectors) as each batch comes back (not in order)."""

    def __init__(self, address: str, encoder: str):
        import ray

        # A process connected already (a server's scorer replicas) keeps its connection, and keeps it after
        self._started = not ray.is_initialized()
        connect(address, use="--ray / [build] ray_address", reuse=True)
        self._ray = ray
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        self.slots = gpus or int(resources.get("CPU", 0))
        if self.slots < 1:
            self.__exit__()
            raise RayUnavailable(f"the Ray cluster at {address!r} has no CPU or GPU to embed on")
        self.where = f"Ray at {address}: {gpus} GPU(s)" if gpus else f"Ray at {address}: {self.slots} CPU(s)"
        self._encoder = encoder
        self._task = ray.remote(embed_batch).options(num_cpus=0 if gpus else 1, num_gpus=1 if gpus else 0,
                                                    max_retries=RETRIES, retry_exceptions=False)

    def __enter__(self) -> RayBatches:
        return self

    def __exit__(self, *exc) -> None:
        if self._started:  # this process leaves the cluster it joined: its next build may name another
            self._ray.shutdown()

    def __call__(self, batches: list[list[str]]) -> Iterator[tuple[int, np.ndarray]]:
        ray, pending, waiting = self._ray, {}, iter(enumerate(batches))
        for index, texts in waiting:  # twice the slots in flight: a worker never waits on the driver
            pending[self._task.remote(self._encoder, texts)] = index
            if len(pending) >= 2 * self.slots:
                break
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(done[0])
            try:
                vectors = ray.get(done[0])
            except (ray.exceptions.RayError, OSError) as error:
                for ref in pending:
                    ray.cancel(ref)
                raise RayUnavailable(f"a batch of passages could not be embedded on the cluster (a lost worker is "
                                     f"tried {RETRIES} times; {type(error).__name__}: {str(error)[:300]}); what "
                                     "was embedded before is kept in the cache: index again to go on") from None
            for next_index, texts in waiting:
                pending[self._task.remote(self._encoder, texts)] = next_index
                break
            yield index, np.asarray(vectors, dtype=np.float32)
