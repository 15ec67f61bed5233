"""OpenAI's chat completions on `gradfuse serve`: `POST /v1/chat/completions` and `GET /v1/models`, so that chat
front ends (Open WebUI, LibreChat) and code written against the `openai` SDK ask gradfuse.

- `model` names a method: `gradfuse` is the server's default, `gradfuse-<method>` any other (`/v1/models` lists
  them, each with what it costs).
- The conversation becomes one question (gradfuse.conversation): the user's recent turns, joined.
- The answer's text keeps its [n] markers; the message carries `citations` (number, source, doc id, title, location
  with its `cited_as`, and the sentences quoted from it) and `evidence` (every quoted sentence with its span), and
  the response a `gradfuse` object (failed sources, abstained, support, method). Streamed, these come once, with the
  last chunk (finish_reason "stop"), and never change.
- Every limit of /ask applies (query length, k, LM passes, max_new_tokens as `max_tokens`, the LM line, the body);
  errors come in OpenAI's shape (server/errors.py). `temperature`, `top_p`, `stop`, `user`, `seed` and any other
  field are accepted and ignored: answers are quoted or greedily decoded, the same for every caller.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from gradfuse.conversation import question_of
from gradfuse.methods import LM_METHODS, METHODS
from gradfuse.redact import redact
from gradfuse.schemas import answer_outcome, answer_record, citations_and_evidence
from gradfuse.server.admission import Busy, LMAdmission
from gradfuse.server.errors import UnknownModel
from gradfuse.server.requests import LARGEST, AskRequest
from gradfuse.server.settings import ServerSettings
from gradfuse.server.streams import EventStream, Recorder, finished_answer, start_answer
from gradfuse.workspace import Answer, Workspace

MODEL = "gradfuse"
CREATED = 1767225600  # the models' "created" (OpenAI's field): 2026-01-01, the same on every server


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ...: not read
    role: str
    content: str | list[dict] | None = None

    def text(self) -> str:
        """The message's text: of OpenAI's list of parts, the text parts (an image is not read)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class ChatRequest(BaseModel):
    # Clients send many of OpenAI's options (logprobs, seed, stream_options, ...): accepted and ignored.
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="gradfuse, or gradfuse-<method> (GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1, le=LARGEST, description="the answer's token budget")
    max_completion_tokens: int | None = Field(None, ge=1, le=LARGEST, description="the same, OpenAI's newer name")
    n: int = Field(1, ge=1, le=1, description="one answer per request")
    temperature: float | None = None  # accepted, ignored (documented above)
    top_p: float | None = None
    stop: str | list[str] | None = None
    user: str | None = None


def method_of(model: str, default: str) -> str:
    if model == MODEL:
        return default
    method = model.removeprefix(f"{MODEL}-")
    if model.startswith(f"{MODEL}-") and method in METHODS and method != "single:<source>":
        return method
    raise UnknownModel(f"the model {model!r} does not exist: GET /v1/models lists this server's")


def model_records(default: str) -> list[dict]:
    def cost(method: str) -> str:
        return "a scoring-LM pass over the top candidates (seconds on a CPU)" if method in LM_METHODS \
            else "fusion or embedding only (milliseconds)"

    records = [{"id": MODEL, "object": "model", "created": CREATED, "owned_by": "gradfuse",
                "gradfuse": {"method": default, "cost": cost(default), "default": True}}]
    records += [{"id": f"{MODEL}-{m}", "object": "model", "created": CREATED, "owned_by": "gradfuse",
                 "gradfuse": {"method": m, "cost": cost(m), "default": False}}
                for m in METHODS if m != "single:<source>"]
    return records


def add_chat_routes(app: FastAPI, workspace: Workspace, settings: ServerSettings, admission: LMAdmission,
                    recorded: Recorder, guarded: list, posted: list) -> None:
    config = workspace.config

    @app.get("/v1/models", dependencies=guarded, tags=["openai"])
    def list_models() -> dict:
        """The models this server answers as: one per gradfuse method, with its cost."""
        return {"object": "list", "data": model_records(config.method)}

    @app.post("/v1/chat/completions", dependencies=posted, tags=["openai"],
              responses={400: {}, 401: {}, 404: {}, 413: {}, 502: {}, 503: {}})
    async def chat_completions(request: ChatRequest, http: Request):
        """OpenAI's chat completion, answered with gradfuse's citations and quoted evidence (`stream` for
        chat.completion.chunk events)."""
        method = method_of(request.model, config.method)
        question = question_of([(m.role, m.text()) for m in request.messages], settings.max_query_chars)
        # Errors name what the client sent: the question is made of its messages, the budget is its max_tokens
        budget = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        ask = AskRequest.from_client({"query": "the question from messages", "max_new_tokens": budget},
                                     query=question, method=method,
                                     max_new_tokens=request.max_completion_tokens or request.max_tokens)
        ask.check_limits(settings, config)
        events, _, release = await start_answer(workspace, admission, recorded, ask, http.state.principal)
        completion = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": request.model}
        if request.stream:
            return EventStream(_chunks(completion, events), events, release)
        answer = await finished_answer(events, release, http)
        if answer is None:
            return Response(status_code=499)
        record = answer_record(answer)
        message = {"role": "assistant", "content": record.answer, **citations_and_evidence(record)}
        body = {**completion, "object": "chat.completion", "usage": None,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "gradfuse": answer_outcome(record)}
        return Response(_dumps(body), media_type="application/json")


def _chunks(completion: dict, events: Iterator) -> Iterator[str]:
    """chat.completion.chunk events: the role first, the text as it is decoded, then an empty delta with
    finish_reason "stop" carrying the citations and evidence, and `data: [DONE]`."""

    def chunk(delta: dict, finish: str | None = None, **extension) -> str:
        body = {**completion, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extension}
        return f"data: {_dumps(body)}\n\n"

    try:
        yield chunk({"role": "assistant", "content": ""})
        for event in events:
            if isinstance(event, Answer):
                record = answer_record(event)
                yield chunk(citations_and_evidence(record), "stop", gradfuse=answer_outcome(record))
            else:
                yield chunk({"content": event})
        yield "data: [DONE]\n\n"
    except Exception as error:  # after the first chunk an error can only be a chunk of its own (the SDK raises it)
        failure = {"message": redact(f"{type(error).__name__}: {error}"), "type": "server_error", "param": None,
                   "code": "overloaded" if isinstance(error, Busy) else "server_error"}
        yield f"data: {json.dumps({'error': failure})}\n\n"
    finally:
        events.close()


def _dumps(body: dict) -> str:
    """JSON as browsers parse it: a non-finite score (NaN) is null, as in gradfuse's own records."""
    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        return [finite(item) for item in value] if isinstance(value, list) else value

    return json.dumps(finite(body), allow_nan=False)
