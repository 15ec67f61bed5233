"""A streamed response that holds a place in the LM line until it ends, however it ends (/ask's events and the
OpenAI-compatible chunks alike)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool


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
