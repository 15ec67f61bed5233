"""Query many sources at once: each on its own workers, each with a deadline and a breaker (sources/guard.py),
failures reported by name."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace

from gradfuse.candidate import Candidate
from gradfuse.redact import redact
from gradfuse.sources.base import QueryNotAnswered, Source
from gradfuse.sources.guard import Guards, SourceUnavailable


@dataclass(frozen=True)
class SourceFailure:
    source: str
    reason: str  # "timeout", "error", "busy" (its workers held by late calls) or "open" (its breaker)
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


Opener = Callable[[str], tuple[Source, Callable[[], None]]]  # a name → its source and what releases it


def query_sources(sources: list[Source], query: str, k: int, timeouts: dict[str, float],
                  guards: Guards) -> FederatedResult:
    """Every source answers within its own timeout or is reported; raises only when none answered."""
    if not sources:
        raise ValueError("no sources to query")
    by_name = {s.name: s for s in sources}
    return ask_sources(list(by_name), lambda name: (by_name[name], _nothing), query, k, timeouts, guards)


def ask_sources(names: list[str], open_source: Opener, query: str, k: int, timeouts: dict[str, float],
                guards: Guards) -> FederatedResult:
    """Each source opened and asked on its own workers (sources/guard.py), within one deadline for both, the
    loading of its models left out of it: a source that fails, hangs, is busy or whose breaker is open is a failure
    of its own, reported by name, and the others answer. Raises only when none answered."""
    if not names:
        raise ValueError("no sources to query")
    started = time.perf_counter()
    failures: dict[str, SourceFailure] = {}
    opening: dict[str, tuple] = {}
    for name in names:
        guard = guards[name]
        try:
            guard.admit()
            opening[name] = (guard, guard.submit(open_source, name), time.perf_counter())
        except SourceUnavailable as error:
            failures[name] = _failure(guards, name, error, admitted=error.reason != "open")
    opened: dict[str, tuple[Source, float]] = {}  # name → (source, seconds of its deadline used by opening)
    releases = []
    for name, (guard, future, submitted) in opening.items():
        try:
            source, release = guard.wait(future, _left(timeouts[name], started),
                                         on_late=lambda late: late[1]())  # opened after all: let go of it
        except FutureTimeout:
            failures[name] = _failure(guards, name, _Late(f"not opened within {timeouts[name]:g} s"))
            continue
        except Exception as error:  # a source that cannot open (a refused connection, a missing index) fails alone
            failures[name] = _failure(guards, name, error)
            continue
        releases.append(release)
        opened[name] = (source, time.perf_counter() - started)
    try:
        return _searched(opened, failures, query, k, timeouts, guards, names)
    finally:
        for release in releases:
            release()


def _searched(opened, failures, query, k, timeouts, guards, names) -> FederatedResult:
    for name, (source, _) in list(opened.items()):  # models load once, outside the deadline: a cold start is no fault
        try:
            source.warm()
        except Exception as error:  # e.g. an encoder that cannot load: this source fails, the rest answer
            del opened[name]
            failures[name] = _failure(guards, name, error)
    started = time.perf_counter()
    asked = {}
    for name, (source, used) in opened.items():
        try:
            asked[name] = (guards[name].submit(_timed_search, source, query, k, guards.settings.max_passage_chars),
                           timeouts[name] - used)
        except SourceUnavailable as error:
            failures[name] = _failure(guards, name, error)
    result = FederatedResult(ranked_lists={})
    for name, (future, left) in asked.items():
        try:
            candidates, seconds = guards[name].wait(future, _left(left, started))
        except FutureTimeout:
            failures[name] = _failure(guards, name, _Late(f"no answer within {timeouts[name]:g} s"))
        except Exception as error:  # any failure of one source is reported, never allowed to sink the others
            failures[name] = _failure(guards, name, error)
        else:
            guards[name].breaker.succeeded()
            result.ranked_lists[name] = candidates
            result.seconds[name] = seconds
    result.failures = [failures[n] for n in names if n in failures]
    if not result.ranked_lists:
        raise AllSourcesFailed(result.failures)
    result.wall_seconds = time.perf_counter() - started
    return result


def checked_sources(names: list[str], check: Callable[[str], object], timeouts: dict[str, float],
                    guards: Guards) -> list[tuple[str, object, str | None]]:
    """(name, what `check` returned, None) for each source it returns for within the source's timeout, on the
    source's own workers, all at once; (name, None, why) for the rest. A look, not a call: no breaker counts it,
    and a source whose breaker is open is not opened."""
    started = time.perf_counter()
    checking, checked = {}, {}
    for name in names:
        try:
            if guards[name].breaker.state() == "open":
                raise guards[name].open_error()
            checking[name] = guards[name].submit(check, name)
        except SourceUnavailable as error:
            checked[name] = (name, None, str(error))
    for name, future in checking.items():
        try:
            checked[name] = (name, guards[name].wait(future, _left(timeouts[name], started)), None)
        except FutureTimeout:
            checked[name] = (name, None, f"no answer within {timeouts[name]:g} s")
        except Exception as error:  # one unreadable index or unreachable database must not hide the others
            checked[name] = (name, None, f"{type(error).__name__}: {error}")
    return [checked[n] for n in names]


class _Late(Exception):
    """A call past the source's deadline."""


def _failure(guards: Guards, name: str, error: Exception, *, admitted: bool = True) -> SourceFailure:
    """The failure as reported, counted by the source's breaker where the source was called (a query it was not
    made for is no fault of the source)."""
    if isinstance(error, _Late):
        reason, detail = "timeout", f"{error} (more time: [sources.{name}] timeout_s, or the request's timeout)"
    elif isinstance(error, SourceUnavailable):
        reason, detail = error.reason, str(error)
    else:
        reason, detail = "error", f"{type(error).__name__}: {error}"
    if admitted:
        if isinstance(error, QueryNotAnswered):
            guards[name].breaker.succeeded()
        else:
            guards[name].breaker.failed(f"{reason}: {detail}")
    return SourceFailure(name, reason, detail)


def _left(timeout: float, started: float) -> float:
    return max(0.0, timeout - (time.perf_counter() - started))


def _nothing() -> None:
    """Nothing to release: the caller holds its sources."""


def _timed_search(source: Source, query: str, k: int, max_chars: int) -> tuple[list[Candidate], float]:
    started = time.perf_counter()
    candidates = [cut_passage(c, max_chars) for c in source.search(query, k)]
    return candidates, time.perf_counter() - started


def cut_passage(candidate: Candidate, max_chars: int) -> Candidate:
    """`candidate` with its text cut to `max_chars` (at a space near the end, where there is one), its length
    before in `cut_from`: every later step (fusion, sentence splitting, scoring, the prompt) is then bounded."""
    text = candidate.text
    if len(text) <= max_chars:
        return candidate
    space = text.rfind(" ", max_chars * 9 // 10, max_chars + 1)
    kept = text[:space if space > 0 else max_chars].rstrip()
    span = (candidate.span[0], candidate.span[0] + len(kept)) if candidate.span else None
    return replace(candidate, text=kept, span=span, cut_from=candidate.cut_from or len(text))
