"""Any OpenAI-compatible chat endpoint (llama.cpp server, vLLM, Ollama) by URL."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gradfuse.checked import LOOPBACK
from gradfuse.redact import redact

if TYPE_CHECKING:
    import httpx


class EndpointError(RuntimeError):
    pass


CHARS_PER_TOKEN = 3  # a cautious count for a tokenizer we cannot see (English BPE averages about 4)




class OpenAICompatibleGenerator:
    def __init__(self, url: str, *, model: str = "default", timeout_s: float = 120.0, context_tokens: int = 8192,
                 api_key_env: str = ""):
        """`api_key_env`: the environment variable whose value goes to this endpoint as its Bearer key ([generator]
        api_key_env); none is sent unless named, and never over plain http to another machine."""
        import httpx  # here, not at the top: a command that never writes an answer need not load it

        # Accept the server root, .../v1, or the full chat path.
        base = url.rstrip("/")
        if not base.endswith("/chat/completions"):
            base = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
        # The URL may carry credentials (http://user:secret@host): requests use it, messages and answers never do.
        self.url, self.model, self.context_tokens = base, model, context_tokens
        self.name, self._shown = redact(url), redact(base)
        headers = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise EndpointError(f"[generator] api_key_env names {api_key_env}, which is not set")
            parsed = httpx.URL(base)
            if parsed.scheme != "https" and parsed.host not in LOOPBACK:
                raise EndpointError(f"refusing to send {api_key_env} over plain http to {parsed.host}: use https, "
                                    "or an endpoint on this machine")
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """An estimate: the endpoint's tokenizer is not ours to run ([generator] context_tokens is its window)."""
        return sum(len(m["content"]) // CHARS_PER_TOKEN + 4 for m in messages)

    def generate(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, passages: int = 0) -> str:
        # `passages` (cite-first decoding) needs logit access, which this API does not give: served models are
        # expected to be large enough to cite when asked.
        return self._completion(self._post(self._body(messages, max_new_tokens)))

    def _completion(self, response: httpx.Response) -> str:
        try:
            return response.json()["choices"][0]["message"]["content"].strip()
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise EndpointError(f"generator endpoint {self._shown} sent an unexpected body: {response.text[:300]}") from error

    def stream(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, passages: int = 0) -> Iterator[str]:
        """The endpoint's own token stream (`"stream": true`, server-sent `data:` lines of chat deltas). An endpoint
        that does not stream answers with one JSON completion, which is then the one piece; a stream with no text
        at all is an error, not a silent empty answer."""
        import httpx

        body = {**self._body(messages, max_new_tokens), "stream": True}
        streamed = False
        try:
            with self._client.stream("POST", self.url, json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise EndpointError(f"generator endpoint {self._shown} answered {response.status_code}: "
                                        f"{response.text[:300]}")
                if response.headers.get("content-type", "").startswith("application/json"):
                    response.read()
                    yield self._completion(response)
                    return
                for line in response.iter_lines():
                    data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                    if not data or data == "[DONE]":
                        continue
                    try:
                        piece = json.loads(data)["choices"][0]["delta"].get("content")
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as error:
                        raise EndpointError(f"generator endpoint {self._shown} streamed an unexpected line: "
                                            f"{data[:300]}") from error
                    if piece:
                        streamed = True
                        yield piece
        except httpx.HTTPError as error:
            raise EndpointError(f"generator endpoint {self._shown} unreachable: {error}") from error
        if not streamed:
            raise EndpointError(f"generator endpoint {self._shown} streamed no text")

    def _body(self, messages, max_new_tokens: int) -> dict:
        return {"model": self.model, "messages": messages, "max_tokens": max_new_tokens, "temperature": 0}

    def _post(self, body: dict) -> httpx.Response:
        import httpx

        try:
            response = self._client.post(self.url, json=body)
        except httpx.HTTPError as error:
            raise EndpointError(f"generator endpoint {self._shown} unreachable: {error}") from error
        if response.status_code != 200:
            raise EndpointError(f"generator endpoint {self._shown} answered {response.status_code}: {response.text[:300]}")
        return response
