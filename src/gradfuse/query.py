"""The query pipeline: route (above `[routing] above` sources, only the sources their summaries pick are asked:
selection/routing.py) → retrieve (each source's own ranking, concurrently, federation/federated.py) → select the
sources (stage 1) → rank their passages (fusion, or stage 2's scoring LM), by one method (methods.py).

It may import sources/, selection/, rerank/, methods.py and execute/, never the answer path or a shell."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from gradfuse.access import EVERYTHING, Principal
from gradfuse.candidate import Candidate
from gradfuse.checked import MAX_DEPTH
from gradfuse.config import Config
from gradfuse.execute import Executor
from gradfuse.methods import PIPELINE_METHODS, MethodContext, check_method, run_method, spec_of
from gradfuse.redact import without_addresses
from gradfuse.rerank import RerankOutcome
from gradfuse.selection import SelectionDecision, SelectionSettings
from gradfuse.selection.routing import RoutingDecision, route
from gradfuse.federation.catalog import SourceCatalog
from gradfuse.embedding.encoder import EmbeddingCache, embedding_text, load_encoder
from gradfuse.federation.federated import AllSourcesFailed, FederatedResult, SourceFailure, ask_sources


@dataclass
class SearchResult:
    query: str
    method: str
    candidates: list[Candidate]  # ranked by the method, best first, cut to k
    ranked_lists: dict[str, list[Candidate]]  # what each answering source returned
    failures: list[SourceFailure]
    timings: dict[str, float] = field(default_factory=dict)  # seconds: routing, retrieval, ranking, source:<name>
    selection: SelectionDecision | None = None  # stage 1's decision (select, gro)
    rerank: RerankOutcome | None = None  # stage 2's pass (gradient, gro, the LM baselines, the oracles)
    routing: RoutingDecision | None = None  # which sources were asked at all (above `[routing] above` sources)


class QueryPipeline:
    def __init__(self, config: Config, catalog: SourceCatalog, executor: Executor):
        self.config, self.catalog, self.executor = config, catalog, executor
        self._embeddings: EmbeddingCache | None = None
        self._lock = threading.Lock()
        self._routing_turns = itertools.count()  # which unjudged sources a routed question asks (routing.route)

    def close(self) -> None:
        with self._lock:
            embeddings, self._embeddings = self._embeddings, None
        if embeddings is not None:
            embeddings.close()

    def search(self, query: str, *, method: str | None = None, k: int | None = None, sources: list[str] | None = None,
               retrieval: str | None = None, timeout_s: float | None = None, depth: int | None = None,
               gold: str | None = None, principal: Principal = EVERYTHING, **rerank_options) -> SearchResult:
        method = method or self.config.method
        names = self.catalog.resolve(sources, principal)
        check_method(method, names)
        if method.startswith("single:"):
            names = [method.removeprefix("single:")]
        k = k or self.config.k
        routing, started = None, time.perf_counter()
        if not method.startswith("single:") and len(names) > self.config.routing.above:
            routing = self.route(query, names, principal)
            names = routing.asked
        routed = time.perf_counter() - started
        # sources routed past for their open breakers fail as they would have if asked
        skipped = [SourceFailure(n, "open", str(self.catalog.guards[n].open_error()))
                   for n in (routing.breaker_open if routing else [])]
        if routing is not None and not names:  # every source empty: nothing to ask (not "every source")
            if skipped:
                raise AllSourcesFailed(skipped)
            federated = FederatedResult({})
        else:
            try:
                federated = self.retrieve(query, sources=names, retrieval=retrieval, timeout_s=timeout_s,
                                          depth=max(k, depth or self.config.depth), principal=principal)
            except AllSourcesFailed as failed:
                raise AllSourcesFailed(failed.failures + skipped) from None
        federated.failures += skipped
        result = self.rank(query, federated, method=method, k=k, gold=gold, **rerank_options)
        if routing is not None:
            if principal.readers is not None:  # scores come of every document's vectors: which sources only
                routing = replace(routing, scores={}, reasons={})
            result.routing, result.timings["routing"] = routing, routed
        return result

    def route(self, query: str, names: list[str], principal: Principal = EVERYTHING) -> RoutingDecision:
        """The sources among `names` that `query` is sent to, from their summaries (`[routing]`). Why a source has
        no summary (a remote's address and its error) is told only to a key that reads everything, as /sources
        does."""
        if not query.strip():
            raise ValueError("the query is empty")
        vector = self.encoder().encode_query(query)
        table, unscored, empty = self.catalog.summaries.table(names, len(vector))
        if not principal.reads_everything:
            unscored = dict.fromkeys(unscored, "no summary to judge it by")
        unavailable = {n: "its breaker is open: not asked until its cool-down ends ([guard] breaker_cooldown_s)"
                       for n in names if self.catalog.guards.state(n) == "open"}
        return route(vector, table, self.config.routing, unscored, empty, unavailable=unavailable,
                     turn=next(self._routing_turns))

    def retrieve(self, query: str, *, sources: list[str] | None = None, retrieval: str | None = None,
                 timeout_s: float | None = None, depth: int | None = None,
                 principal: Principal = EVERYTHING) -> FederatedResult:
        """Each source's own ranking, of the sources and passages `principal` may read only (gradfuse.access)."""
        if not query.strip():
            raise ValueError("the query is empty")
        if depth is not None and not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be 1 to {MAX_DEPTH} (candidates asked of each source)")
        names = self.catalog.resolve(sources, principal)
        try:
            federated = ask_sources(names, lambda name: self.catalog.lease(name, retrieval), query,
                                    depth or self.config.depth, self.catalog.timeouts(names, timeout_s),
                                    self.catalog.guards, principal.readers, self.catalog.timeouts(names))
        except AllSourcesFailed as failed:
            raise AllSourcesFailed(_shown(failed.failures, principal)) from None
        federated.failures = _shown(federated.failures, principal)
        return federated

    def rank(self, query: str, federated: FederatedResult, *, method: str | None = None, k: int | None = None,
             gold: str | None = None, selection: SelectionSettings | None = None, **rerank_options) -> SearchResult:
        method = method or self.config.method
        check_method(method, list(federated.ranked_lists) + [f.source for f in federated.failures])
        k = k or self.config.k
        started = time.perf_counter()
        context = None
        if method in PIPELINE_METHODS:  # only they need the encoder's and the scoring LM's view
            rerank = replace(self.config.rerank, **rerank_options)
            if spec_of(method, rerank.scorer).target and rerank.target == "gold" and not gold:
                raise ValueError(f"method {method!r} with target 'gold' needs a reference answer (gold)")
            context = MethodContext(
                question=query, query_vector=self.encoder().encode_query(query), embed=self.embed,
                selection=selection or self.config.selection, rerank=rerank, gold=gold, k=k,
                executor=self.executor,
            )
        weights = {n: self.config.settings(n).weight for n in federated.ranked_lists}
        ranked = run_method(method, federated.ranked_lists, weights=weights, context=context)
        timings = {"retrieval": federated.wall_seconds, "ranking": time.perf_counter() - started, **ranked.seconds}
        timings.update({f"source:{n}": s for n, s in federated.seconds.items()})
        return SearchResult(query, method, ranked.candidates[:k], federated.ranked_lists, federated.failures,
                            timings, selection=ranked.selection, rerank=ranked.rerank)

    def encoder(self):
        return load_encoder(self.config.encoder)

    def embed(self, candidates: list[Candidate]) -> np.ndarray:
        """Candidate vectors from the workspace cache: indexed passages hit it on disk; an engine's or a remote's
        are encoded and held in memory, bounded (embedding/encoder.py)."""
        with self._lock:
            if self._embeddings is None:
                self._embeddings = EmbeddingCache(self.catalog.root / "cache" / "embeddings.sqlite", self.encoder())
        return self._embeddings.embed([embedding_text(c.title, c.text) for c in candidates], keep=False)

    @property
    def embeddings(self) -> EmbeddingCache | None:
        """The candidate vectors' cache, once a method has needed it."""
        return self._embeddings


def _shown(failures: list[SourceFailure], principal: Principal) -> list[SourceFailure]:
    """The failures as `principal` is told them: without the sources' addresses, but to a key that reads everything
    (as /sources tells a failure's detail)."""
    if principal.reads_everything:
        return failures
    return [replace(f, detail=without_addresses(f.detail)) for f in failures]
