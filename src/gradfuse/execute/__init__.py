"""Where the LM-bound work of a query runs: in this process, or on a pool of scorer replicas on a Ray cluster.

The evaluation harness and the server call one interface, whichever runs underneath:

- `score(scorer, question, docs, settings, gold=, k=)`: all the scoring-LM work of one re-rank
  (`gradfuse.rerank.score_pool`), plain data in and out;
- `sentences(scorer, question, passages, settings, target=, calibrated=)`: an answer's sentence evidence by an LM
  scorer (`gradfuse.rerank.sentences.score_fitting`): how many passages one pass took, and their sentences' values;
- `map(fn, items)`: `fn` over `items`, with as many in flight as there are replicas (results in order);
- `replicas`: how many requests can score at once (the server's admission line counts them).

Retrieval, fusion, stage 1, the encoder's evidence (cosine) and answer generation stay in the calling process;
only the scoring LM's passes move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import numpy as np

from gradfuse.ray_cluster import RayUnavailable  # noqa: F401 (where callers catch it)
from gradfuse.rerank import RerankSettings, Scored, score_pool
from gradfuse.rerank.sentences import Passage, score_fitting




class Executor(Protocol):
    replicas: int

    def score(self, scorer: str, question: str, docs: list[str], settings: RerankSettings, *,
              gold: str | None = None, k: int = 10) -> Scored: ...

    def sentences(self, scorer: str, question: str, passages: list[Passage], settings: RerankSettings, *,
                  target: str | None = None, calibrated: bool = False) -> tuple[int, np.ndarray]: ...

    def map(self, fn: Callable, items: Iterable) -> Iterator: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class LocalExecutor:
    """This process: one loaded scorer, one pass at a time (torch already spreads a pass over every core)."""

    replicas = 1

    def score(self, scorer: str, question: str, docs: list[str], settings: RerankSettings, *,
              gold: str | None = None, k: int = 10) -> Scored:
        return score_pool(scorer, question, docs, settings, gold=gold, k=k)

    def sentences(self, scorer: str, question: str, passages: list[Passage], settings: RerankSettings, *,
                  target: str | None = None, calibrated: bool = False) -> tuple[int, np.ndarray]:
        return score_fitting(scorer, question, passages, settings, target=target, calibrated=calibrated)

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        return map(fn, items)

    def describe(self) -> str:
        return "this process"

    def close(self) -> None:
        pass


LOCAL = LocalExecutor()


def make_executor(ray_address: str | None = None, *, replicas: int | None = None) -> Executor:
    """The local executor, or with `ray_address` ("auto", "HOST:PORT" or "ray://HOST:PORT") a pool of scorer
    replicas on that Ray cluster (one per GPU where the cluster has GPUs, else one per node, unless `replicas`)."""
    if not ray_address:
        return LOCAL
    from gradfuse.execute.ray_pool import RayExecutor

    return RayExecutor(ray_address, replicas=replicas)
