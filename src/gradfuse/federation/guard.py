"""Each source fails alone: its own bounded share of worker threads (a bulkhead), a deadline on every call, and a
circuit breaker.

- A call that misses its deadline is abandoned, but its thread stays with the source until the call returns
  (Python cannot stop a thread). When all of a source's workers are held by such calls, the source answers "busy"
  at once: a hung engine or a remote that trickles holds only its own threads, never the other sources'. Calls
  with a deadline shorter than the source's own (a request's small `timeout_s`) may take at most half of them,
  running or late: a caller sending many such requests cannot leave the source busy for the others.
- The breaker (closed → open → half-open): after `breaker_failures` failures in a row a source is not called
  for `breaker_cooldown_s`; then one request probes it, and its outcome closes the breaker or opens it again.

The resilience patterns of RPC clients (Hystrix's thread-pool bulkheads, gRPC deadlines) and Elasticsearch's
`skip_unavailable` for remote clusters are the anchors.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal

from pydantic import Field

from gradfuse.checked import FILE_SETTINGS
from gradfuse.sources.base import SourceError

BreakerState = Literal["closed", "open", "half-open"]


@dataclass(frozen=True)
class GuardSettings:
    """`[guard]` in gradfuse.toml."""

    __pydantic_config__ = FILE_SETTINGS
    workers: Annotated[int, Field(ge=1, le=256, strict=True)] = 8  # threads per source (see the module's doc)
    breaker_failures: Annotated[int, Field(ge=0, le=1000, strict=True)] = 5  # failures in a row (0: never opens)
    breaker_cooldown_s: Annotated[float, Field(gt=0, le=86_400, strict=True)] = 30.0  # open, before one probe
    # A passage's text from a source is cut to this many characters on the source's own workers: engines,
    # databases and remotes return documents whole (one 150 KB LanceDB document made /ask take 49.8 s).
    max_passage_chars: Annotated[int, Field(ge=1000, le=10_000_000, strict=True)] = 20_000


class SourceUnavailable(SourceError):
    """The source was not called: its breaker is open, or every worker it has is still held by late calls."""

    def __init__(self, reason: Literal["busy", "open"], message: str, *, its_fault: bool = True):
        super().__init__(message)
        # busy only where a call late by the source's own deadline holds a worker (a caller's shorter deadlines
        # must not open the breaker for every other caller)
        self.reason, self.its_fault = reason, its_fault


class Breaker:
    """One source's circuit breaker. Failures in a row open it; after the cool-down one call is let through."""

    def __init__(self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic):
        self.failures_to_open, self.cooldown_s, self._clock = failures, cooldown_s, clock
        self._lock = threading.Lock()
        self.failures = 0  # in a row
        self.opened_at: float | None = None
        self._probing = False
        self.last_reason = ""  # timeout, error, busy: never a detail (it came of one caller's request)

    def state(self) -> BreakerState:
        with self._lock:
            return self._state()

    def _state(self) -> BreakerState:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self._clock() - self.opened_at >= self.cooldown_s else "open"

    def admit(self) -> bool:
        """Whether a call may go to the source now (half-open: the first caller probes, the others wait it out).
        True means the caller must report the outcome with `succeeded` or `failed`."""
        with self._lock:
            state = self._state()
            if state == "closed":
                return True
            if state == "half-open" and not self._probing:
                self._probing = True
                return True
            return False

    def retry_in(self) -> float:
        """Seconds until an open breaker lets a probe through."""
        with self._lock:
            return 0.0 if self.opened_at is None else max(0.0, self.cooldown_s - (self._clock() - self.opened_at))

    def succeeded(self) -> None:
        with self._lock:
            self.failures, self.opened_at, self._probing = 0, None, False

    def failed(self, reason: str) -> None:
        with self._lock:
            self.failures += 1
            self.last_reason = reason
            if self._probing or (self.failures_to_open and self.failures >= self.failures_to_open):
                self.opened_at = self._clock()  # a failed probe opens it again, for a whole cool-down
            self._probing = False

    def undecided(self) -> None:
        """A call that said nothing of the source (callers' shorter deadlines cut it, or hold its workers):
        another may probe."""
        with self._lock:
            self._probing = False


class SourceGuard:
    """One source's bulkhead and breaker."""

    def __init__(self, name: str, settings: GuardSettings):
        self.name, self.settings = name, settings
        self.breaker = Breaker(settings.breaker_failures, settings.breaker_cooldown_s)
        self._executor: ThreadPoolExecutor | None = None  # made on the first call, let go by `release`
        self._lock = threading.Lock()
        self.late = 0  # calls abandoned past their deadline that still hold a worker
        self.late_by_own_deadline = 0  # of them, those past the source's own deadline (not a caller's shorter one)
        self.hurried = 0  # calls with a deadline shorter than the source's own, running or waiting

    def admit(self) -> None:
        """Raises SourceUnavailable where the breaker keeps the source uncalled."""
        if not self.breaker.admit():
            raise self.open_error()

    def open_error(self) -> SourceUnavailable:
        b = self.breaker
        return SourceUnavailable("open", f"not called: its circuit breaker is open after {b.failures} failures in "
                                         f"a row (the last: {b.last_reason}); the next try in {b.retry_in():.0f} s")

    def submit(self, call: Callable[..., Any], *args, short_deadline: bool = False) -> Future:
        """The call on one of this source's workers; SourceUnavailable ("busy") at once when all of them are held
        by late calls, or, for a call with a deadline shorter than the source's own (`short_deadline`), when half
        of them are taken by such calls, running or late."""
        with self._lock:
            if self.late >= self.settings.workers:
                raise SourceUnavailable("busy", f"busy: all {self.settings.workers} of its workers are still held "
                                                "by calls past their deadline ([guard] workers)",
                                        its_fault=self.late_by_own_deadline > 0)
            if short_deadline and self.hurried >= self.callers_share:
                raise SourceUnavailable("busy", f"busy for a deadline shorter than its own: {self.callers_share} of "
                                                f"its {self.settings.workers} workers, the most such calls may "
                                                "hold, are still held by them (a longer timeout is served)",
                                        its_fault=False)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.settings.workers,
                                                    thread_name_prefix=f"gradfuse-{self.name}")
            try:  # under the lock: `release` cannot shut the workers down between taking them and this
                future = self._executor.submit(call, *args)
            except RuntimeError:  # the interpreter is exiting
                raise SourceUnavailable("busy", "not called: the process is shutting down") from None
            if short_deadline:
                self.hurried += 1
        if short_deadline:
            future.add_done_callback(self._hurried_returned)
        return future

    def _hurried_returned(self, _: Future) -> None:
        with self._lock:
            self.hurried -= 1

    @property
    def callers_share(self) -> int:
        """The workers that calls with their callers' shorter deadlines may take: half, at least one."""
        return max(1, self.settings.workers // 2)

    def wait(self, future: Future, timeout: float):
        """The call's result within `timeout` s; past it the call is abandoned (FutureTimeout, see `abandon`)."""
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            self.abandon(future)
            raise

    def abandon(self, future: Future, on_return: Callable[[Future], None] | None = None, *,
                own_deadline: bool = True) -> None:
        """Give up on a call past its deadline: one not started is cancelled; a running one holds its worker,
        counted as late, until it returns, and `on_return` is then given its future."""
        if future.cancel():
            return
        with self._lock:
            self.late += 1
            self.late_by_own_deadline += own_deadline
        future.add_done_callback(lambda done: self._returned(done, on_return, own_deadline))

    def _returned(self, future: Future, on_return, own_deadline: bool) -> None:
        with self._lock:
            self.late -= 1
            self.late_by_own_deadline -= own_deadline
        if on_return is not None:
            on_return(future)

    def release(self) -> None:
        """Let the idle workers go (the source was closed: at 1,000 sources they would be thousands of threads);
        workers held by late calls stay, and so does the breaker. The next call makes them again."""
        with self._lock:
            if self.late:
                return
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


class Guards:
    """Every source's guard, made on first use (by name: a publish keeps the source's breaker and workers)."""

    def __init__(self, settings: GuardSettings | None = None):
        self.settings = settings or GuardSettings()
        self._guards: dict[str, SourceGuard] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> SourceGuard:
        with self._lock:
            guard = self._guards.get(name)
            if guard is None:
                guard = self._guards[name] = SourceGuard(name, self.settings)
            return guard

    def release(self, name: str) -> None:
        with self._lock:
            guard = self._guards.get(name)
        if guard is not None:
            guard.release()

    def state(self, name: str) -> BreakerState:
        with self._lock:
            guard = self._guards.get(name)
        return guard.breaker.state() if guard else "closed"

    def close(self) -> None:
        with self._lock:
            guards, self._guards = list(self._guards.values()), {}
        for guard in guards:
            guard.close()
