"""Query many sources at once: each in its own thread, each with a deadline, failures reported by name."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace

from gradfuse.candidate import Candidate
from gradfuse.redact import redact
from gradfuse.sources.base import Source


@dataclass(frozen=True)
class SourceFailure:
    source: str
    reason: str  # "timeout" or "error"
    detail: str  # redacted: a driver's message can quote a connection URL with its password

    def __post_init__(self):
        object.__setattr__(self, "detail", redact(self.detail))


class AllSourcesFailed(RuntimeError):
    def __init__(self, failures: list[SourceFailure]):
        self.failures = failures
        listing = "; ".join(f"{f.source}: {f.detail}" for f in failures)
        super().__init__(f"every source failed ({listing})")


@dataclass
class FederatedResult:
    ranked_lists: dict[str, list[Candidate]]  # per answering source, in its own order
    failures: list[SourceFailure] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # per answering source
    wall_seconds: float = 0.0  # the whole concurrent query

    def copy(self) -> FederatedResult:
        """Fresh candidate records (empty scores, nothing merged), so several methods can rank the same lists."""
        return FederatedResult(
            {s: [replace(c, scores={}, merged=[]) for c in candidates] for s, candidates in self.ranked_lists.items()},
            list(self.failures), dict(self.seconds), self.wall_seconds,
        )


# Threads, not processes: the work is I/O, Rust (tantivy) and torch, all of which release the GIL. A source
# that hangs keeps its thread busy, so the pool is shared and sized generously rather than per query.
_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="gradfuse-source")


def query_sources(sources: list[Source], query: str, k: int, timeouts: dict[str, float]) -> FederatedResult:
    """Every source answers within its own timeout or is reported; raises only when none answered."""
    if not sources:
        raise ValueError("no sources to query")
    started = time.perf_counter()
    futures = {s.name: _POOL.submit(_timed_search, s, query, k) for s in sources}
    result = FederatedResult(ranked_lists={})
    for name, future in futures.items():
        remaining = max(0.0, timeouts[name] - (time.perf_counter() - started))
        try:
            candidates, seconds = future.result(timeout=remaining)
        except FutureTimeout:
            future.cancel()
            result.failures.append(SourceFailure(name, "timeout", f"no answer within {timeouts[name]:g} s (more time: "
                                                 f"[sources.{name}] timeout_s, or the request's timeout)"))
        except Exception as error:  # any failure of one source is reported, never allowed to sink the others
            result.failures.append(SourceFailure(name, "error", f"{type(error).__name__}: {error}"))
        else:
            result.ranked_lists[name] = candidates
            result.seconds[name] = seconds
    if not result.ranked_lists:
        raise AllSourcesFailed(result.failures)
    result.wall_seconds = time.perf_counter() - started
    return result


def _timed_search(source: Source, query: str, k: int) -> tuple[list[Candidate], float]:
    started = time.perf_counter()
    candidates = source.search(query, k)
    return candidates, time.perf_counter() - started
