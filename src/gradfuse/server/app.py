"""The FastAPI app: /search, /ask (optionally streamed), /sources, /options, /healthz, /metrics, and the web page
at /."""

from __future__ import annotations

import logging
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request, Security
from fastapi.middleware.cors import CORSMiddleware
from fastapi.middleware.trustedhost import TrustedHostMiddleware
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import APIKeyHeader
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel

from gradfuse import __version__
from gradfuse.methods import METHODS, options_read
from gradfuse.redact import RedactingFilter, redact
from gradfuse.rerank import ESTIMATORS, POOLS, SIGNALS, TARGETS
from gradfuse.schemas import (
    AnswerRecord,
    SearchRecord,
    SourceRecord,
    answer_record,
    search_record,
    served_source_record,
)
from gradfuse.access.keys import KeyRing
from gradfuse.execute import LOCAL
from gradfuse.server.admission import LM_METHODS, Busy, LMAdmission
from gradfuse.server.cache import ResultCache
from gradfuse.server.headers import SecurityHeaders
from gradfuse.server.errors import BodyLimit, KeyRequired, install_error_handlers
from gradfuse.server.requests import AskRequest, SearchRequest
from gradfuse.server.mcp_sessions import McpSessionsPerKey
from gradfuse.server.mcp_tools import build_mcp
from gradfuse.server.metrics import ServerMetrics
from gradfuse.server.openai_chat import add_chat_routes
from gradfuse.server.streams import EventStream, finished_answer, start_answer
from gradfuse.server.settings import ServerSettings
from gradfuse.server.summaries import served_summary
from gradfuse.federation.federated import AllSourcesFailed, SourceFailure
from gradfuse.workspace import Answer, SearchResult, Workspace

STATIC = Path(__file__).parent / "static"


class SourceHealth:
    """What the last requests saw of each source: its last failure, and when it last answered (/sources); each
    request's source calls are counted in the metrics too."""

    def __init__(self, metrics: ServerMetrics):
        self._lock = threading.Lock()
        self._metrics = metrics
        self.last_ok: dict[str, str] = {}
        self.last_failure: dict[str, tuple[str, SourceFailure]] = {}

    def recorded(self, search: Callable[[], SearchResult]) -> SearchResult:
        """`search`'s result, once what it saw of each source is recorded; where every source failed, the
        failures are recorded before the error goes on."""
        try:
            result = search()
        except AllSourcesFailed as error:
            self._record({}, error.failures)
            raise
        self._record({name: result.timings[f"source:{name}"] for name in result.ranked_lists}, result.failures)
        return result

    def _record(self, seconds: dict[str, float], failures: list[SourceFailure]) -> None:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._lock:
            self.last_ok.update({name: now for name in seconds})
            self.last_failure.update({f.source: (now, f) for f in failures})
        self._metrics.record(seconds, failures)


class SourceHealthRecord(SourceRecord):
    breaker: str = "closed"  # its circuit breaker: closed | open (not called) | half-open (the next request probes)
    last_answered_at: str | None = None
    last_failure_at: str | None = None
    last_failure: str | None = None


class Options(BaseModel):
    methods: list[str]
    targets: list[str]
    estimators: list[str]
    signals: list[str]  # gro's stage-2 signals (`scorer`)
    pools: list[str]
    retrieval: list[str]
    reads: dict[str, dict[str, list[str]]]  # method → gro's signal → the options it reads (others are ignored)
    defaults: dict[str, str | int | float]
    limits: dict[str, int | float]
    api_key_required: bool


class Health(BaseModel):
    status: str  # "ok", or "degraded" when some sources cannot be opened (`unavailable`) or a breaker is not closed
    version: str
    sources: int  # sources that open
    unavailable_count: int = 0  # sources that cannot be opened
    breakers_not_closed: int = 0
    # By name, on a server without keys only (with keys, a caller without one learns counts; /sources names them)
    unavailable: dict[str, str] = {}  # source → why it cannot be opened
    breakers: dict[str, str] = {}  # source → its circuit breaker's state, where it is not closed
    scorer_replicas: int  # stage 2's LM passes: 1 in this process, or the Ray cluster's replicas alive or starting


def create_app(workspace: Workspace, settings: ServerSettings | None = None, *, preload_lm: bool = False) -> FastAPI:
    """`preload_lm` loads the scoring LM/generator at start-up instead of on the first request that needs it."""
    settings = settings or workspace.config.server
    access = workspace.config.access
    keys = KeyRing(settings.resolved_api_key(), access)
    admission = LMAdmission(settings.lm_queue, lambda: workspace.executor.replicas)
    cache = ResultCache(workspace, settings.cache_mb)
    metrics = ServerMetrics(workspace, admission, cache)
    health = SourceHealth(metrics)
    config = workspace.config

    mcp = build_mcp(workspace, settings, admission, health.recorded, served=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        workspace.query.encoder()  # load once before the first request, not during it
        if preload_lm and workspace.executor is LOCAL:  # replicas on a Ray cluster load their own
            from gradfuse.rerank import load_scorer

            load_scorer(config.rerank.model, config.rerank.doc_tokens, config.rerank.dtype)
        async with mcp.session_manager.run():
            yield

    app = FastAPIOffline(title="gradfuse", version=__version__, lifespan=lifespan,
                         description="Retrieval-augmented generation over many sources at once: federated search, "
                                     "per-query source selection, gradient re-ranking and answers with "
                                     "citations.")
    app.router.redirect_slashes = False  # a redirect's Location would be built from the client's Host header
    install_error_handlers(app)
    # Middleware runs outermost last-added: the host check, then the key (before any body is read), then limits,
    # then MCP sessions per key.
    app.add_middleware(McpSessionsPerKey, per_key=settings.max_mcp_sessions_per_key,
                       idle_s=settings.mcp_idle_timeout_s)  # after the key: whose sessions
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    app.add_middleware(KeyRequired, keys=keys)  # who asks (request.state.principal)
    if not keys.required:  # no key: only names of this machine may reach it, so a DNS-rebinding page cannot
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts())
    app.add_middleware(SecurityHeaders)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "X-API-Key", "Authorization"])
    # Checked by KeyRequired; declared here so that the API's schema and /docs show it.
    key_header = APIKeyHeader(name="X-API-Key", auto_error=False,
                              description="required when the server has a key (GRADFUSE_API_KEY)")

    def authorised(given: str | None = Security(key_header)) -> None:
        pass

    def json_body(request: Request) -> None:
        # required: a cross-site page may send a body without a type, and no preflight asks first
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise HTTPException(415, f"send the body as application/json, not {kind or 'an empty type'}")

    guarded = [Depends(authorised)]
    posted = [*guarded, Depends(json_body)]

    @app.post("/search", dependencies=posted, response_model=SearchRecord,
              responses={401: {}, 413: {}, 415: {}, 422: {}, 503: {"description": "every source failed, or the LM is busy"}})
    def search_endpoint(request: SearchRequest, http: Request):
        """Fused and re-ranked candidates from many sources, each with its provenance and every score (a repeated
        request is answered from the cache until a source is published again: header X-Gradfuse-Cache: hit).
        Only the sources and passages the key may read."""
        request.check_limits(settings, config)
        principal = http.state.principal
        key = cache.key("search", request, principal)
        if (kept := cache.get(key)) is not None:
            return _kept_json(kept[0])
        with admission.slot((request.method or config.method) in LM_METHODS, principal):
            result = health.recorded(lambda: workspace.search(request.query, k=request.k, principal=principal,
                                                              **request.search_options()))
        record_json = search_record(result).model_dump_json()
        cache.put(key, (record_json,), failed=bool(result.failures))
        return _json(record_json)

    @app.post("/ask", dependencies=posted, response_model=AnswerRecord,
              responses={401: {}, 413: {}, 415: {}, 422: {}, 502: {"description": "the generator endpoint failed"}, 503: {},
                         200: {"content": {"text/event-stream": {}},
                               "description": "with stream: events search, token (repeated), answer"}})
    async def ask_endpoint(request: AskRequest, http: Request):
        """An answer with citations [n] mapped to source/doc id; `stream: true` sends server-sent events. A
        repeated question is answered from the cache until a source is published again."""
        request.check_limits(settings, config)
        principal = http.state.principal
        key = cache.key("ask", request, principal)
        if (kept := cache.get(key)) is not None:
            searched_json, answer_json = kept
            if request.stream:
                return StreamingResponse(_replayed(searched_json, answer_json), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", CACHE_HEADER: "hit"})
            return _kept_json(answer_json)
        # retrieval and ranking errors become plain HTTP errors, before any event
        events, searched, release = await start_answer(workspace, admission, health.recorded, request, principal)

        def keep(searched_json: str, answer_json: str) -> None:  # each record serialised once, for both
            cache.put(key, (searched_json, answer_json), failed=bool(searched.failures))

        if request.stream:
            return EventStream(_event_stream(search_record(searched).model_dump_json(), events, keep), events,
                               release)
        answer = await finished_answer(events, release, http)
        if answer is None:
            return Response(status_code=499)  # nobody reads it: the client is gone
        answer_json = answer_record(answer).model_dump_json()
        keep(search_record(searched).model_dump_json(), answer_json)
        return _json(answer_json)

    add_chat_routes(app, workspace, settings, admission, health.recorded, guarded, posted)
    # MCP's streamable HTTP at /mcp: its own route, behind the same middleware (the key, the body limit)
    # (its own Host/Origin check is off: TrustedHost guards a keyless server and the key every other)
    app.router.routes.extend(mcp.streamable_http_app(
        streamable_http_path="/mcp", max_sessions=settings.max_mcp_sessions,
        session_idle_timeout=settings.mcp_idle_timeout_s, transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=False)).routes)

    @app.get("/sources", dependencies=guarded, response_model=list[SourceHealthRecord])
    def sources_endpoint(http: Request) -> list[SourceHealthRecord]:
        """Each enabled source the key may read: whether its index opens, its size, encoder and last build, and
        what the last requests saw of it."""
        records, principal = [], http.state.principal
        for name, stats, error in workspace.source_health(principal=principal):
            failure = health.last_failure.get(name)
            record = served_source_record(name, stats, error)
            # when a shared source last answered or failed tells when others used it: to a key that reads all only
            everything = principal.reads_everything
            records.append(SourceHealthRecord(
                **record.model_dump(), breaker=workspace.guards.state(name),
                last_answered_at=health.last_ok.get(name) if everything else None,
                last_failure_at=failure[0] if failure and everything else None,
                # its detail came of another caller's request (an engine's error may quote the query): its reason
                # only, but to a key that reads everything
                last_failure=(f"{failure[1].reason}: {failure[1].detail}" if everything
                              else failure[1].reason) if failure else None,
            ))
        return records

    @app.get("/sources/{name}/summary", dependencies=guarded, responses={404: {"description": "it has no summary"},
                                                                                 422: {"description": "no such source"}})
    def summary_endpoint(name: str, http: Request) -> Response:
        """A source's summary (its topics' centroids and a sample of its passage vectors, float16 in base64), which
        a gradfuse that asks this one routes by; for a key that may read every document of it."""
        return JSONResponse(served_summary(workspace, name, http.state.principal))

    @app.get("/options", dependencies=guarded, response_model=Options)
    def options_endpoint() -> Options:
        """Valid names and this server's defaults and limits, for clients and the web page."""
        return Options(
            methods=list(METHODS), targets=list(TARGETS), estimators=list(ESTIMATORS), signals=list(SIGNALS),
            pools=list(POOLS),
            retrieval=["bm25", "dense", "hybrid"],
            reads={method: {signal: list(options_read(method, signal)) for signal in SIGNALS} for method in METHODS},
            defaults={"method": config.method, "k": config.k, "context_k": config.context_k,
                      "target": config.rerank.target, "estimator": config.rerank.estimator, "n": config.rerank.n,
                      "scorer": config.rerank.scorer, "pool": config.rerank.pool},
            limits={**{name: getattr(settings, name) for name in (
                "max_query_chars", "max_gold_chars", "max_k", "max_n", "max_depth", "max_new_tokens",
                "max_timeout_s", "max_body_bytes", "max_lm_passes")},
                "max_pass_tokens": config.rerank.max_pass_tokens},  # question + target + n documents, in tokens
            api_key_required=keys.required,
        )

    @app.get("/metrics", dependencies=guarded, response_class=PlainTextResponse)
    def metrics_endpoint(request: Request) -> Response:
        """Prometheus metrics: each source's search latency, failures by reason and breaker state, the LM line's
        depth and the result cache's hits and misses; for a key that may read everything (they name every source)."""
        if not request.state.principal.reads_everything:
            raise HTTPException(404, "Not Found")
        return metrics.response(request.headers.get("accept"))

    @app.get("/healthz", response_model=Health, responses={503: {"description": "no source is built"}})
    def healthz():
        """Liveness and readiness: 200 when at least one source can answer, "degraded" with the indexes that
        cannot be opened and the sources whose circuit breaker is not closed named; 503 when none can (no key
        needed). Database sources count as configured: their failures are reported per request and in /sources.
        With keys, no source is named (a caller without a key learns counts only): /sources names them, to a key."""
        health = workspace.source_health(databases=False, stats=False)  # opening is the check
        unavailable = {name: error for name, _, error in health if error}
        count = len(health) - len(unavailable) + len([n for n in workspace.source_names() if n not in
                                                      {name for name, _, _ in health}])  # + the databases
        if not count:
            detail = "; ".join(f"{n}: {e}" for n, e in unavailable.items()) or "no sources are built"
            raise HTTPException(503, "no source of this server's workspace can answer"
                                     + ("" if keys.required else f" ({redact(detail)})"))
        breakers = {n: state for n in workspace.source_names() if (state := workspace.guards.state(n)) != "closed"}
        named = not keys.required
        return Health(status="degraded" if unavailable or breakers else "ok", version=__version__, sources=count,
                      unavailable_count=len(unavailable), breakers_not_closed=len(breakers),
                      unavailable={n: redact(e) for n, e in unavailable.items()} if named else {},
                      breakers=breakers if named else {}, scorer_replicas=workspace.executor.replicas)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _event_stream(searched_json: str, events: Iterator, keep: Callable[[str, str], None]) -> Iterator[str]:
    """Server-sent events; an error after the first event can only be reported as an event of its own."""
    try:
        yield f"event: search\ndata: {searched_json}\n\n"
        for event in events:
            if isinstance(event, Answer):
                keep(searched_json, answer_json := answer_record(event).model_dump_json())
                yield f"event: answer\ndata: {answer_json}\n\n"
            else:
                yield _event("token", {"text": event})
    except Exception as error:
        status = 503 if isinstance(error, Busy) else 500
        yield _event("error", {"status": status, "detail": redact(f"{type(error).__name__}: {error}")})
    finally:
        events.close()  # a client that left: the generator stops at its next piece instead of running on


def _replayed(searched_json: str, answer_json: str) -> Iterator[str]:
    """A kept answer as the events it was first sent as: its text arrives as one token."""
    yield f"event: search\ndata: {searched_json}\n\n"
    yield _event("token", {"text": json.loads(answer_json)["answer"]})
    yield f"event: answer\ndata: {answer_json}\n\n"


CACHE_HEADER = "X-Gradfuse-Cache"


def _json(body: str, **headers: str) -> Response:
    """A record serialised once, for the client and the cache (validating a long answer again took 20 ms)."""
    return Response(body, media_type="application/json", headers=headers)


def _kept_json(body: str) -> Response:
    """A kept result as it was first sent."""
    return _json(body, **{CACHE_HEADER: "hit"})


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def serve(workspace: Workspace, settings: ServerSettings, *, preload_lm: bool = False, log_level: str = "info") -> None:
    import uvicorn

    from gradfuse.server.limits import bound_logs, guarded_protocol, raise_descriptor_limit

    raise_descriptor_limit(settings.max_connections)
    app = create_app(workspace, settings, preload_lm=preload_lm)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                            timeout_graceful_shutdown=5, timeout_keep_alive=settings.keep_alive_s,
                            http=guarded_protocol(settings.max_connections, settings.header_timeout_s,
                                                  settings.max_client_connections))
    server = uvicorn.Server(config)
    bound_logs()  # after uvicorn configured its loggers
    for name in ("uvicorn.error", "uvicorn.access", "gradfuse.server", "asyncio"):
        logging.getLogger(name).addFilter(RedactingFilter())
    server.run()
