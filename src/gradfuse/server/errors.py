"""Every failure becomes a specific status and one readable message: {"detail": "..."} (plus fields that help),
or on OpenAI's paths (/v1/...) OpenAI's shape, {"error": {"message", "type", "param", "code"}}, which its SDKs
and chat front ends read."""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gradfuse.access import EVERYTHING, Principal
from gradfuse.access.keys import KeyRing
from gradfuse.fusion import UnknownMethod
from gradfuse.generate.openai_http import EndpointError
from gradfuse.redact import redact
from gradfuse.server.admission import Busy
from gradfuse.server.requests import RequestLimitError, error_line, field_errors
from gradfuse.sources import SourceError, UnknownSource
from gradfuse.federation.federated import AllSourcesFailed

log = logging.getLogger("gradfuse.server")
RETRY_AFTER_S = 5


OPENAI_PATHS = "/v1/"


def error_response(path: str, status: int, detail: str, *, headers: dict[str, str] | None = None,
                   **extra) -> JSONResponse:
    """gradfuse's error body, or OpenAI's on its paths, where a request's invalid value is a 400 (OpenAI's SDK
    raises BadRequestError for it) and a missing or wrong key an invalid_api_key."""
    param, code = extra.pop("param", None), extra.pop("code", None)
    if not path.startswith(OPENAI_PATHS):
        return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)
    status = 400 if status == 422 else status
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = code or {401: "invalid_api_key", 413: "request_too_large", 503: "overloaded"}.get(status)
    return JSONResponse({"error": {"message": detail, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


class UnknownModel(LookupError):
    """An OpenAI-compatible request named a model this server does not answer as."""


async def _unknown_model(request: Request, error: UnknownModel) -> JSONResponse:
    return error_response(request.url.path, 404, str(error), code="model_not_found")


async def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
    errors = error.errors()
    malformed = [e for e in errors if e.get("type") == "json_invalid"]
    if malformed:
        context = malformed[0].get("ctx", {}).get("error", "")
        return error_response(request.url.path, 400, f"malformed JSON body: {context}".rstrip(": "))
    fields = field_errors(errors)
    readable = [{"field": field, "message": message} for field, message in fields]
    detail = redact(error_line(fields), environment=False)
    return error_response(request.url.path, 422, detail, errors=readable,
                          param=readable[0]["field"] if len(readable) == 1 else None)


def _responder(status: int, *, headers: dict[str, str] | None = None, client_error: bool = False):
    """`client_error`: the answer to a request's own bad input, which names what is wrong without echoing the
    value where the error has that form (`public`), and is never masked by the secrets' values (a mask that
    shows which guess matched would be an oracle)."""

    async def respond(request: Request, error: Exception) -> JSONResponse:
        if client_error:
            detail = redact(getattr(error, "public", None) or str(error), environment=False)
        else:
            detail = redact(str(error))
        return error_response(request.url.path, status, detail, headers=headers)

    return respond


async def _all_failed(request: Request, error: AllSourcesFailed) -> JSONResponse:
    failures = [{"source": f.source, "reason": f.reason, "detail": f.detail} for f in error.failures]
    return error_response(request.url.path, 503, redact(str(error)), failures=failures)


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(request.url.path, 500,
                          f"internal error ({type(error).__name__}); the server log has the traceback")


async def _http(request: Request, error: HTTPException) -> JSONResponse:
    return error_response(request.url.path, error.status_code, str(error.detail), headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(UnknownModel, _unknown_model)
    # Order matters only for subclasses: Starlette looks up the most specific class first.
    app.add_exception_handler(UnknownSource, _responder(422, client_error=True))
    app.add_exception_handler(UnknownMethod, _responder(422, client_error=True))
    app.add_exception_handler(RequestLimitError, _responder(422, client_error=True))
    # the library's invalid-option errors (gold missing, a pass too long, ...)
    app.add_exception_handler(ValueError, _responder(422, client_error=True))
    app.add_exception_handler(AllSourcesFailed, _all_failed)
    app.add_exception_handler(SourceError, _responder(503))  # nothing built, an index unreadable
    app.add_exception_handler(Busy, _responder(503, headers={"Retry-After": str(RETRY_AFTER_S)}))
    app.add_exception_handler(EndpointError, _responder(502))
    app.add_exception_handler(Exception, _unexpected)


class BodyLimit:
    """ASGI middleware: a body above `max_bytes` is refused with 413, by its Content-Length or while it streams;
    a body still incomplete `timeout_s` after the request began is refused with 408 (a slow client holds a worker
    otherwise)."""

    def __init__(self, app, max_bytes: int, timeout_s: float = 30.0):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(scope["path"], 413, self._detail(int(declared)))(scope, receive, send)
            return
        received, complete = 0, False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def limited_receive():
            nonlocal received, complete
            if complete:  # after the body, receive() waits for the client to leave: no deadline there
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {self.timeout_s:g} s") from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI passes HTTPExceptions raised while it reads the body through unchanged.
                    raise HTTPException(413, self._detail(received))
            return message

        await self.app(scope, limited_receive, send)

    def _detail(self, size: int) -> str:
        return f"request body of {size} bytes is above this server's limit of {self.max_bytes} bytes"


class KeyRequired:
    """ASGI middleware: who a request comes from (gradfuse.access), kept in its state as `principal`. With keys
    set, every path but the page, its files, /healthz and the API docs needs one, in X-API-Key or as
    `Authorization: Bearer <key>` (what OpenAI's SDK and MCP clients send), and a request without one is refused
    with 401 before its body is read (a malformed body from a client without a key learns nothing). Without keys
    every request may read everything (the server then answers this machine's names only)."""

    OPEN = ("/", "/healthz", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")
    OPEN_PREFIXES = ("/static/", "/static-offline-docs/")

    def __init__(self, app, keys: KeyRing):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            principal = self._principal(scope) if self.keys.required else EVERYTHING
            if principal is None and not self._open(scope["path"]):
                await error_response(scope["path"], 401, "missing or wrong API key: send it in the X-API-Key "
                                     "header or as Authorization: Bearer <key>",
                                     headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
            scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    def _principal(self, scope) -> Principal | None:
        headers = dict(scope["headers"])
        bearer = headers.get(b"authorization", b"")
        return self.keys.principal(headers.get(b"x-api-key")
                                   or (bearer[7:].strip() if bearer[:7].lower() == b"bearer " else b""))

    def _open(self, path: str) -> bool:
        return path in self.OPEN or path.startswith(self.OPEN_PREFIXES)
