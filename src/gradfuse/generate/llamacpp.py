"""A GGUF model in llama.cpp (the prebuilt `xllamacpp` wheel): greedy completion from token ids or text.

On this project's 2-core CPU it decodes SmolLM2 at about 100 tokens/s against 17 in transformers, and loads in
under a second, so drafts and answers from a GGUF file go through it; gradients still need transformers.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from gradfuse.loading import loaded_once

REPETITION_PENALTY = 1.15  # the 135M model loops on its own phrases without it (the same in transformers)


class LlamaCppUnavailable(RuntimeError):
    pass


class LlamaCppEngine:
    """One llama.cpp context over one GGUF file; one completion at a time (a lock), like the transformers path."""

    def __init__(self, path: Path, *, context_tokens: int = 8192):
        try:
            import xllamacpp
        except ImportError as error:
            raise LlamaCppUnavailable("llama.cpp is not installed (pip install xllamacpp)") from error
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_ctx = context_tokens
        params.n_parallel = 1
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
        params.warmup = False
        params.verbosity = -1
        params.n_gpu_layers = 0 if not _has_gpu() else 999
        # The wheel's Server also listens on a random loopback port inside our process; we call it directly, so
        # its HTTP side gets a key nobody holds and refuses every request (any local user could use it otherwise).
        params.api_keys = [secrets.token_urlsafe(32)]
        self.path, self.context_tokens = path, context_tokens
        self._server = xllamacpp.Server(params)
        self._lock = threading.Lock()

    def complete(self, prompt: list[int] | str, *, max_new_tokens: int, on_piece: Callable[[str], bool] | None = None,
                 continues: bool = False) -> str:
        """Greedy continuation of `prompt` (token ids or text). With `on_piece`, each decoded piece is passed to
        it as it comes; it returns True to stop generating (a client that left).

        A prompt is processed afresh: reusing whatever an earlier request left in the cache made a greedy answer
        depend on that request (a streamed and a plain answer to one question differed). `continues`: the
        prompt extends the one just processed (the cite-first step), whose cache is this request's own."""
        request = {"prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0.0, "top_k": 1,
                   "repeat_penalty": REPETITION_PENALTY, "cache_prompt": continues}
        with self._lock:
            if on_piece is None:
                return self._checked(self._server.handle_completions(request))["choices"][0]["text"].strip()
            pieces: list[str] = []

            def receive(chunk) -> bool:
                chunk = self._checked(chunk)
                piece = chunk["choices"][0]["text"] if chunk.get("choices") else chunk.get("content", "")
                if piece:
                    pieces.append(piece)
                    return bool(on_piece(piece))
                return False

            self._server.handle_completions({**request, "stream": True}, receive)
            return "".join(pieces).strip()

    def next_token_among(self, prompt: list[int] | str, allowed: list[str]) -> str:
        """The most likely of `allowed` (single-token strings) as the next token of `prompt`."""
        request = {"prompt": prompt, "max_tokens": 1, "temperature": 0.0, "n_probs": 100, "cache_prompt": False}
        with self._lock:
            result = self._checked(self._server.handle_completions(request))
        probabilities = result["choices"][0].get("logprobs") or {}
        ranked = [entry for step in probabilities.get("content", []) for entry in step.get("top_logprobs", [])]
        for entry in sorted(ranked, key=lambda e: -e.get("logprob", float("-inf"))):
            if entry.get("token", "").strip() in allowed:
                return entry["token"].strip()
        return allowed[0]  # none of them among the 100 likeliest: the first passage

    @staticmethod
    def _checked(response: dict) -> dict:
        if isinstance(response, dict) and ("error" in response or "code" in response):
            detail = response.get("error", response)
            raise RuntimeError(f"llama.cpp: {detail.get('message', detail) if isinstance(detail, dict) else detail}")
        return response


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@loaded_once(maxsize=2)
def load_llamacpp(path: str) -> LlamaCppEngine:
    return LlamaCppEngine(Path(path))
