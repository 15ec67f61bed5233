"""Query many sources at once: each on its own workers, each with a deadline and a breaker (federation/guard.py),
failures reported by name."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace

from gradfuse.access import Readers, may_read
from gradfuse.candidate import Candidate
from gradfuse.redact import redact
from gradfuse.sources.base import CallerRefused, QueryNotAnswered, Source, SourceError
from gradfuse.federation.guard import Guards, SourceUnavailable


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
                  guards: Guards, readers: Readers = None) -> FederatedResult:
    """Every source answers within its own timeout or is reported; raises only when none answered."""
    if not sources:
        raise ValueError("no sources to query")
    by_name = {s.name: s for s in sources}
    return ask_sources(list(by_name), lambda name: (by_name[name], _nothing), query, k, timeouts, guards, readers)


def ask_sources(names: list[str], open_source: Opener, query: str, k: int, timeouts: dict[str, float],
                guards: Guards, readers: Readers = None, own_timeouts: dict[str, float] | None = None
                ) -> FederatedResult:
    """Each source opened and asked on its own workers (federation/guard.py), within one deadline for both, the
    loading of its models left out of it, and asked as soon as it is open, so one slow to open delays no other: a
    source that fails, hangs, is busy or whose breaker is open is a failure of its own, reported by name, and the
    others answer. Raises only when none answered. `readers`: the caller's (gradfuse.access), which each source
    filters by inside its store; None: every passage. `own_timeouts`: the sources' own, where the caller chose
    `timeouts`: a call late only by a caller's shorter deadline does not count toward the breaker (no caller may
    open it for every other)."""
    if not names:
        raise ValueError("no sources to query")
    ask = _Round(query, k, timeouts, guards, readers, own_timeouts or timeouts)
    try:
        ask.run(names, open_source)
    finally:
        ask.release()
    result = ask.result  # in the order asked, whatever the order they answered in: fusion breaks ties by it
    result.ranked_lists = {n: result.ranked_lists[n] for n in names if n in result.ranked_lists}
    result.failures = [ask.failures[n] for n in names if n in ask.failures]
    if not result.ranked_lists:
        raise AllSourcesFailed(result.failures)
    return result


class _Round:
    """One federated query: each source's call in flight (opening, then searching) against the source's own
    deadline, which the time spent loading models moves on for every source (a cold start is no fault)."""

    def __init__(self, query: str, k: int, timeouts: dict[str, float], guards: Guards, readers: Readers,
                 own_timeouts: dict[str, float]):
        self.query, self.k, self.timeouts, self.guards, self.readers = query, k, timeouts, guards, readers
        self.own_timeouts = own_timeouts
        self.started = time.perf_counter()
        self.deadlines = {name: self.started + timeout for name, timeout in timeouts.items()}
        self.pending: dict[Future, tuple[str, str]] = {}  # a call in flight → (its source, "open" or "search")
        self.releases: dict[str, Callable[[], None]] = {}  # what lets go of each opened source
        self.failures: dict[str, SourceFailure] = {}
        self.result = FederatedResult(ranked_lists={})
        self.warming = 0.0

    def run(self, names: list[str], open_source: Opener) -> None:
        for name in names:
            try:
                self.guards[name].admit()
                self.pending[self.guards[name].submit(open_source, name, short_deadline=self._short(name))] = \
                    (name, "open")
            except SourceUnavailable as error:
                self.failures[name] = _failure(self.guards, name, error, admitted=error.reason != "open")
        while self.pending:
            soonest = min(self.deadlines[name] for name, _ in self.pending.values())
            done, _ = wait(list(self.pending), timeout=max(0.0, soonest - time.perf_counter()),
                           return_when=FIRST_COMPLETED)
            for future in done:
                self._returned(future, *self.pending.pop(future))
            now = time.perf_counter()
            for future, (name, step) in list(self.pending.items()):
                if now >= self.deadlines[name] and not future.done():
                    del self.pending[future]
                    self._abandon(future, name, step)
        self.result.wall_seconds = time.perf_counter() - self.started - self.warming

    def _returned(self, future: Future, name: str, step: str) -> None:
        try:
            returned = future.result()
        except Exception as error:  # any failure of one source is reported, never allowed to sink the others
            self.failures[name] = _failure(self.guards, name, error)
            return
        if step == "search":
            candidates, seconds = returned
            self.guards[name].breaker.succeeded()
            self.result.ranked_lists[name] = candidates
            self.result.seconds[name] = seconds
            return
        source, self.releases[name] = returned
        warming = time.perf_counter()
        try:
            source.warm()  # models load once, outside the deadline
        except Exception as error:  # e.g. an encoder that cannot load: this source fails, the rest answer
            self.failures[name] = _failure(self.guards, name, error)
            return
        finally:
            self._moved_on(time.perf_counter() - warming)
        try:
            searching = self.guards[name].submit(_timed_search, source, self.query, self.k,
                                                 self.guards.settings.max_passage_chars, self.readers,
                                                 short_deadline=self._short(name))
        except SourceUnavailable as error:
            self.failures[name] = _failure(self.guards, name, error)
            return
        self.pending[searching] = (name, "search")

    def _moved_on(self, seconds: float) -> None:
        self.warming += seconds
        for name in self.deadlines:
            self.deadlines[name] += seconds

    def _short(self, name: str) -> bool:
        """Whether the caller gave `name` a shorter deadline than its own."""
        return self.timeouts[name] < self.own_timeouts[name]

    def _abandon(self, future: Future, name: str, step: str) -> None:
        """A call past its deadline: its source is let go of once the call returns (an open that ends late is
        released then; a late search keeps its source held until it ends)."""
        its_fault = not self._short(name)
        if step == "open":
            self.guards[name].abandon(future, _release_opened, own_deadline=its_fault)
            late = _Late(f"not opened within {self.timeouts[name]:g} s", its_fault)
        else:
            self.guards[name].abandon(future, lambda _, release=self.releases.pop(name): release(),
                                      own_deadline=its_fault)
            late = _Late(f"no answer within {self.timeouts[name]:g} s", its_fault)
        self.failures[name] = _failure(self.guards, name, late)

    def release(self) -> None:
        for release in self.releases.values():
            release()
        self.releases = {}


def _release_opened(future: Future) -> None:
    if future.exception() is None:
        future.result()[1]()


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
    """A call past its deadline: the source's own (its fault), or a caller's shorter one."""

    def __init__(self, message: str, its_fault: bool):
        super().__init__(message)
        self.its_fault = its_fault


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
        if isinstance(error, CallerRefused):  # what one caller sent: no word on the source either way
            guards[name].breaker.undecided()
        elif isinstance(error, (QueryNotAnswered, UnreadableReturned)):  # it answered: one caller's answer is refused
            guards[name].breaker.succeeded()
        elif not getattr(error, "its_fault", True):  # late or busy by callers' shorter deadlines only
            guards[name].breaker.undecided()
        else:
            guards[name].breaker.failed(reason)
    return SourceFailure(name, reason, detail)


def _left(timeout: float, started: float) -> float:
    return max(0.0, timeout - (time.perf_counter() - started))


def _nothing() -> None:
    """Nothing to release: the caller holds its sources."""


def _timed_search(source: Source, query: str, k: int, max_chars: int,
                  readers: Readers) -> tuple[list[Candidate], float]:
    started = time.perf_counter()
    found = source.search(query, k) if readers is None else source.search(query, k, readers=readers)
    if not all(may_read(c.readers, readers) for c in found):  # the store's filter failed: none is used
        # (no count: how many passages a caller may not read match its query is itself not for it to know)
        raise UnreadableReturned("it returned passages this caller may not read (its filter on readers did not "
                                 "hold): none of its passages is used")
    candidates = [cut_passage(c, max_chars) for c in found]
    return candidates, time.perf_counter() - started


class UnreadableReturned(SourceError):
    """A source returned passages its caller may not read, which its own filter should have kept back."""


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
