"""A pool of scorer replicas on a Ray cluster: Ray Core actors that each hold one loaded scoring LM.

Each replica runs one re-rank (`gradfuse.rerank.score_pool`) or one answer's sentence evidence
(`gradfuse.rerank.sentences.score_fitting`) at a time, asks for `cpus_per_replica` CPUs and, when
the cluster has GPUs, for one GPU (the scorer then runs there); replicas are spread over the nodes. A replica
that dies (its node lost, its process killed) costs nothing but time: the request it held is sent to another
replica, and a replacement is started wherever the cluster has room. Requests fail only when no replica is left
and none can be started within `startup_timeout_s`.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gradfuse.execute import RayUnavailable
from gradfuse.ray_cluster import connect
from gradfuse.rerank import RerankSettings, Scored
from gradfuse.rerank.sentences import Passage

class ScorerReplica:
    """One Ray actor: a scoring LM loaded on first use (on the actor's GPU when it was given one)."""

    def __init__(self):
        import ray

        self.device = "cuda" if ray.get_gpu_ids() else "cpu"

    def where(self) -> dict:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "device": self.device}

    def score(self, scorer: str, question: str, docs: list[str], settings: RerankSettings, gold: str | None,
              k: int) -> Scored:
        from gradfuse.rerank import score_pool

        return score_pool(scorer, question, docs, settings, gold=gold, k=k, device=self.device)

    def sentences(self, scorer: str, question: str, passages: list[Passage], settings: RerankSettings,
                  target: str | None, calibrated: bool) -> tuple[int, np.ndarray]:
        from gradfuse.rerank.sentences import score_fitting

        return score_fitting(scorer, question, passages, settings, target=target, calibrated=calibrated,
                             device=self.device)


class RayExecutor:
    def __init__(self, address: str, *, replicas: int | None = None, cpus_per_replica: float = 1,
                 startup_timeout_s: float = 120.0, attempts: int = 4):
        ray = self._ray = connect(address, use="--ray / [server] ray")
        self.address = address
        self.startup_timeout_s = startup_timeout_s
        self.attempts = attempts
        atexit.register(self.close)
        resources = ray.cluster_resources()
        self.gpu = resources.get("GPU", 0) >= 1
        nodes = [n for n in ray.nodes() if n["Alive"]]
        self.target = replicas or (int(resources["GPU"]) if self.gpu else len(nodes))
        if self.target < 1:
            raise RayUnavailable(f"the Ray cluster at {address!r} has no node to hold a scorer replica")
        self._actor = ray.remote(ScorerReplica).options(
            num_cpus=cpus_per_replica, num_gpus=1 if self.gpu else 0,
            scheduling_strategy="SPREAD", max_restarts=0)
        self._lock = threading.Lock()
        self._idle: queue.Queue = queue.Queue()
        self._live: set = set()
        self._starting: dict = {}  # actor → its `where` reference, until it answers
        self.lost = 0  # replicas that died while this executor ran
        for _ in range(self.target):
            self._start_one()
        self._wait_for_first()

    @property
    def replicas(self) -> int:
        """Replicas alive or starting (what the server's admission line counts)."""
        with self._lock:
            return max(1, len(self._live) + len(self._starting))

    def describe(self) -> str:
        with self._lock:
            live, starting = len(self._live), len(self._starting)
        kind = "GPU" if self.gpu else "CPU"
        return (f"Ray cluster {self.address}: {live} {kind} scorer replica(s)"
                + (f", {starting} starting" if starting else "") + (f", {self.lost} lost" if self.lost else ""))

    def score(self, scorer: str, question: str, docs: list[str], settings: RerankSettings, *,
              gold: str | None = None, k: int = 10) -> Scored:
        return self._on_a_replica("score", scorer, question, docs, settings, gold, k)

    def sentences(self, scorer: str, question: str, passages: list[Passage], settings: RerankSettings, *,
                  target: str | None = None, calibrated: bool = False) -> tuple[int, np.ndarray]:
        return self._on_a_replica("sentences", scorer, question, passages, settings, target, calibrated)

    def _on_a_replica(self, name: str, *args):
        """The replica's method `name` on a free replica; where that replica dies, on another."""
        ray = self._ray
        for _ in range(self.attempts):
            actor, alive = self._acquire(), True
            try:
                return ray.get(getattr(actor, name).remote(*args))
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
                alive = False
                self._replace(actor)  # the request goes to another replica
            except ray.exceptions.RayTaskError as error:
                raise error.as_instanceof_cause() from None  # the scorer's own error, as it would be locally
            finally:
                if alive:  # back in the pool, whatever the request's outcome
                    self._idle.put(actor)
        raise RayUnavailable(f"{self.attempts} scorer replicas in a row died under one request on {self.address!r}")

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """`fn` over `items` from as many threads as there are replicas; each call's `score` waits for a free
        replica, so the cluster is kept busy while results come back in order."""
        pool = ThreadPoolExecutor(max_workers=self.target, thread_name_prefix="gradfuse-ray")
        try:
            yield from pool.map(fn, items)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        ray = self._ray
        with self._lock:
            actors, self._live, self._starting = [*self._live, *self._starting], set(), {}
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone with its node
                pass
        if ray.is_initialized():
            ray.shutdown()

    # --- the pool

    def _start_one(self) -> None:
        actor = self._actor.remote()
        with self._lock:
            self._starting[actor] = actor.where.remote()

    def _collect_started(self) -> None:
        """Move replicas that answered into the idle queue; drop those that died starting."""
        ray = self._ray
        with self._lock:
            starting = dict(self._starting)
        if not starting:
            return
        ready, _ = ray.wait(list(starting.values()), num_returns=len(starting), timeout=0)
        for actor, ref in starting.items():
            if ref not in ready:
                continue
            with self._lock:
                self._starting.pop(actor, None)
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                self.lost += 1
                continue
            with self._lock:
                self._live.add(actor)
            self._idle.put(actor)

    def _acquire(self):
        deadline = None
        while True:
            self._collect_started()
            try:
                actor = self._idle.get(timeout=0.2)
            except queue.Empty:
                with self._lock:
                    live, starting = len(self._live), len(self._starting)
                if live:
                    deadline = None
                    continue  # every replica busy: wait for one
                if not starting:
                    self._start_one()
                deadline = deadline or time.monotonic() + self.startup_timeout_s
                if time.monotonic() > deadline:
                    raise RayUnavailable(f"no scorer replica on the Ray cluster at {self.address!r} came up within "
                                         f"{self.startup_timeout_s:.0f} s (is there room for one: "
                                         f"{'a GPU' if self.gpu else 'a free CPU'}?)") from None
                continue
            with self._lock:
                if actor in self._live:
                    return actor  # else: replaced while it sat in the queue

    def _replace(self, actor) -> None:
        with self._lock:
            if actor not in self._live:
                return
            self._live.discard(actor)
            self.lost += 1
        self._start_one()  # pending until the cluster has room (a lost node's work moves to the others)

    def _wait_for_first(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self._collect_started()
            with self._lock:
                if self._live:
                    return
                if not self._starting:
                    break
            time.sleep(0.1)
        self.close()
        raise RayUnavailable(f"no scorer replica started on the Ray cluster at {self.address!r} within "
                             f"{self.startup_timeout_s:.0f} s")
