"""An answer's steps as the server takes them (/ask, OpenAI's chat completions, MCP's ask): a place in the LM line
taken before retrieval and given back however the answer ends, the answer stepped piece by piece so that a client
who leaves stops the generator, and a streamed response that holds the place until it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from gradfuse.server.admission import LMAdmission, answer_needs_lm
from gradfuse.server.requests import AskRequest
from gradfuse.access import Principal
from gradfuse.workspace import Answer, SearchResult, Workspace


# Runs a search and records what it saw of each source (the server's SourceHealth.recorded).
Recorder = Callable[[Callable[[], SearchResult]], SearchResult]


def unrecorded(search: Callable[[], SearchResult]) -> SearchResult:
    """Where nothing keeps a record (MCP over stdio)."""
    return search()


async def start_answer(workspace: Workspace, admission: LMAdmission, recorded: Recorder, request: AskRequest,
                       principal: Principal) -> tuple[Iterator, SearchResult, Callable[[], None]]:
    """A place in the LM line, then retrieval and ranking (of what `principal` may read), whose errors are raised
    here, before anything is sent; the answer's remaining steps, the search, and the one way to give the place
    back."""
    release = admission.place(answer_needs_lm(workspace, request.method), principal)
    try:
        events = workspace.ask_stream(request.query, context_k=request.k, max_new_tokens=request.max_new_tokens,
                                      principal=principal, **request.search_options())
        searched = await run_in_threadpool(recorded, lambda: next(events))
    except BaseException:
        release()
        raise
    return events, searched, release


async def finished_answer(events: Iterator, release: Callable[[], None], http=None) -> Answer | None:
    """The answer, stepped piece by piece in a worker thread (a call cancelled, or an `http` client that left,
    stops the generator at its next piece instead of letting it run to max_new_tokens); None when the client left.
    The place in the LM line is given back either way."""
    try:
        async for event in iterate_in_threadpool(events):
            if isinstance(event, Answer):
                return event
            if http is not None and await http.is_disconnected():
                return None
    finally:
        events.close()
        release()


class EventStream(StreamingResponse):
    """Server-sent events of one answer, which hold a place in the LM line until the response ends, however it
    ends. A client that left before the response started was never given back its place (the body iterator,
    never started, never ran its `finally`): after lm_queue of them every LM request got 503."""

    def __init__(self, body: Iterator[str], events: Iterator, release: Callable[[], None]):
        super().__init__(_closed_when_abandoned(body), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._body, self._events, self._release = body, events, release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # no step of the body is in flight here (a worker's step finishes before cancellation lands)
            self._body.close()
            self._events.close()
            self._release()


async def _closed_when_abandoned(events: Iterator[str]) -> AsyncIterator[str]:
    """Starlette steps a sync iterator in a worker thread and, when the client leaves, abandons it suspended and
    never closed, so generation ran on to max_new_tokens and held the LM. The step in flight finishes before the
    cancellation arrives here, so the iterator can be closed at once: the generator stops at its next piece."""
    try:
        async for event in iterate_in_threadpool(events):
            yield event
    finally:
        events.close()
