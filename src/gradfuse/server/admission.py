"""Admission for the requests that need the language model.

The scoring LM and the generator are loaded once per process and shared by every request thread; each guards
its forward passes with a lock, because torch already spreads one pass over every core (two passes at once only
slow each other). So LM-bound requests run one at a time; this class bounds how many may wait in that line and
refuses the rest at once, while fusion-only requests (rrf, dense, select, ...) never wait behind them.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from gradfuse.methods import LM_METHODS

__all__ = ["LM_METHODS", "Busy", "LMAdmission"]


class Busy(RuntimeError):
    def __init__(self, limit: int):
        super().__init__(f"{limit} language-model requests are already running or queued; retry later "
                         "(rank with a fusion method such as rrf, dense or select to avoid the model)")


class LMAdmission:
    def __init__(self, limit: int):
        self.limit = limit
        self.active = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            if self.active >= self.limit:
                raise Busy(self.limit)
            self.active += 1

    def release(self) -> None:
        with self._lock:
            self.active -= 1

    @contextmanager
    def slot(self, needed: bool = True):
        """Hold a place in the LM line for the duration (a no-op when the request does not need the LM)."""
        if not needed:
            yield
            return
        self.acquire()
        try:
            yield
        finally:
            self.release()
