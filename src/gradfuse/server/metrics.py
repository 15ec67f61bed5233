"""/metrics: what the server has seen of its sources, its LM line and its result cache, exposed by the official
Prometheus client. Each app has its own registry, so several apps in one process (the tests make many) neither
share counts nor clash over names. Labels are source names from the workspace (a bounded set) and failure reasons,
never a request's text."""

from __future__ import annotations

from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from gradfuse.server.admission import LMAdmission
from gradfuse.server.cache import ResultCache
from gradfuse.federation.federated import SourceFailure
from gradfuse.workspace import Workspace

BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}  # worse is higher: an alert can ask for > 0
# The client's buckets (up to 10 s, the default timeout_s) and on to 60 s, the default max_timeout_s a request may set.
LATENCY_BUCKETS = (*Histogram.DEFAULT_BUCKETS[:-1], 30.0, 60.0, float("inf"))


class ServerMetrics:
    """Source calls are counted as requests record them (`record`); the breakers, the LM line and the cache are
    read when scraped, from the objects that keep them, so no copy can drift."""

    def __init__(self, workspace: Workspace, admission: LMAdmission, cache: ResultCache):
        self.registry = CollectorRegistry()
        self._seconds = Histogram("gradfuse_source_search_seconds",
                                  "Seconds an answering source took to search, on its own workers",
                                  ["source"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self._failures = Counter("gradfuse_source_failures", "Source calls that failed, by reason: timeout, "
                                 "error, busy (its workers held by late calls) or open (its breaker)",
                                 ["source", "reason"], registry=self.registry)
        self.registry.register(_ReadWhenScraped(workspace, admission, cache))

    def record(self, seconds: dict[str, float], failures: list[SourceFailure]) -> None:
        """One request's sources: the seconds of each that answered, and the failures of the others."""
        for source, spent in seconds.items():
            self._seconds.labels(source=source).observe(spent)
        for failure in failures:
            self._failures.labels(source=failure.source, reason=failure.reason).inc()

    def response(self, accept: str | None) -> Response:
        """The text format, or OpenMetrics where the scraper asks for it (the client's own negotiation)."""
        encode, media_type = choose_encoder(accept)
        return Response(encode(self.registry), media_type=media_type)


class _ReadWhenScraped:
    """A collector of what other objects already keep."""

    def __init__(self, workspace: Workspace, admission: LMAdmission, cache: ResultCache):
        self._workspace, self._admission, self._cache = workspace, admission, cache

    def collect(self):
        breakers = GaugeMetricFamily("gradfuse_source_breaker_state",
                                     "Each source's circuit breaker: 0 closed, 1 half-open, 2 open", labels=["source"])
        for name in self._workspace.source_names():
            breakers.add_metric([name], BREAKER_STATES[self._workspace.guards.state(name)])
        yield breakers
        yield GaugeMetricFamily("gradfuse_lm_queue_depth", "Language-model requests running or waiting in the LM "
                                "line", value=self._admission.active)
        yield GaugeMetricFamily("gradfuse_lm_queue_limit", "Requests the LM line holds; more are refused with 503 "
                                "([server] lm_queue, plus one per further scorer replica)", value=self._admission.limit)
        yield CounterMetricFamily("gradfuse_result_cache_hits", "/search and /ask requests answered from the "
                                  "result cache", value=self._cache.hits)
        yield CounterMetricFamily("gradfuse_result_cache_misses", "/search and /ask requests the result cache could "
                                  "keep but did not hold", value=self._cache.misses)
