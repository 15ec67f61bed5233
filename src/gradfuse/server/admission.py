"""Admission for the requests that need the language model.

The scoring LM and the generator are loaded once per process and shared by every request thread; each guards
its forward passes with a lock, because torch already spreads one pass over every core (two passes at once only
slow each other). So LM-bound requests run one at a time; this class bounds how many may wait in that line and
refuses the rest at once, while fusion-only requests (rrf, dense, select, ...) never wait behind them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

from gradfuse.access import EVERYTHING, Principal
from gradfuse.methods import LM_METHODS

__all__ = ["LM_METHODS", "Busy", "LMAdmission", "answer_needs_lm"]


def answer_needs_lm(workspace, method: str | None) -> bool:
    """Whether an answer by `method` holds the LM: a local generator that writes, a stage-2 method and an LM
    evidence scorer do; quoting does not."""
    from gradfuse.rerank.sentences import LM_SENTENCE_SCORERS

    config = workspace.config
    local_generator = not workspace.answers_extractively and not config.generator.startswith(("http://", "https://"))
    return local_generator or (method or config.method) in LM_METHODS or config.evidence.scorer in LM_SENTENCE_SCORERS


class Busy(RuntimeError):
    def __init__(self, limit: int, own: bool = False):
        held = (f"this key holds {limit} places in the language-model line, the most one key may (half of it)"
                if own else f"{limit} language-model requests are already running or queued")
        super().__init__(f"{held}; retry later (rank with a fusion method such as rrf, dense or select to avoid "
                         "the model)")


class LMAdmission:
    """`queue` requests running or waiting with one scorer; each further replica (a Ray cluster's, see
    gradfuse.execute) runs one more at once, so the line grows by one per replica alive or starting. One key
    (a principal other than the single key's or a keyless server's) holds at most half of the line: one key sending
    8 `gro` requests refused every other key's LM requests."""

    def __init__(self, queue: int, replicas: Callable[[], int] = lambda: 1):
        self.queue = queue
        self.replicas = replicas
        self.active = 0
        self._held: dict[str, int] = {}  # places by principal's name
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        return self.queue + max(1, self.replicas()) - 1

    def acquire(self, principal: Principal = EVERYTHING) -> None:
        with self._lock:
            limit = self.limit
            if self.active >= limit:
                raise Busy(limit)
            share = max(1, limit // 2)
            if principal.name != EVERYTHING.name and self._held.get(principal.name, 0) >= share:
                raise Busy(share, own=True)
            self.active += 1
            self._held[principal.name] = self._held.get(principal.name, 0) + 1

    def release(self, principal: Principal = EVERYTHING) -> None:
        with self._lock:
            self.active -= 1
            self._held[principal.name] -= 1
            if not self._held[principal.name]:
                del self._held[principal.name]

    def place(self, needed: bool = True, principal: Principal = EVERYTHING) -> Callable[[], None]:
        """Take a place in the line (or none, when the request does not need the LM) and return the one way to
        give it back, which may be called any number of times from any scope: a streamed answer gives it back
        where its response ends, whether or not its body was ever started."""
        if not needed:
            return lambda: None
        self.acquire(principal)
        given_back = threading.Event()

        def give_back() -> None:
            with self._lock:
                if given_back.is_set():
                    return
                given_back.set()
            self.release(principal)

        return give_back

    @contextmanager
    def slot(self, needed: bool = True, principal: Principal = EVERYTHING):
        """Hold a place in the LM line for the duration (a no-op when the request does not need the LM)."""
        if not needed:
            yield
            return
        self.acquire(principal)
        try:
            yield
        finally:
            self.release(principal)
