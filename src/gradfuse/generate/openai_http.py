"""Any OpenAI-compatible chat endpoint (llama.cpp server, vLLM, Ollama) by URL."""

from __future__ import annotations

import os

import httpx


class EndpointError(RuntimeError):
    pass


class OpenAICompatibleGenerator:
    def __init__(self, url: str, *, model: str = "default", timeout_s: float = 120.0):
        # Accept the server root, .../v1, or the full chat path.
        base = url.rstrip("/")
        if not base.endswith("/chat/completions"):
            base = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
        self.name, self.url, self.model = url, base, model
        key = os.environ.get("OPENAI_API_KEY")
        self._client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {key}"} if key else {})

    def generate(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, passages: int = 0) -> str:
        # `passages` (cite-first decoding) needs logit access, which this API does not give: served models are
        # expected to be large enough to cite when asked.
        body = {"model": self.model, "messages": messages, "max_tokens": max_new_tokens, "temperature": 0}
        try:
            response = self._client.post(self.url, json=body)
        except httpx.HTTPError as error:
            raise EndpointError(f"generator endpoint {self.url} unreachable: {error}") from error
        if response.status_code != 200:
            raise EndpointError(f"generator endpoint {self.url} answered {response.status_code}: {response.text[:300]}")
        try:
            return response.json()["choices"][0]["message"]["content"].strip()
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise EndpointError(f"generator endpoint {self.url} sent an unexpected body: {response.text[:300]}") from error
