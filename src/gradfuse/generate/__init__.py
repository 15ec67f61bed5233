"""Answer generation: one factory over local models and OpenAI-compatible endpoints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from gradfuse.generate.budget import ContextTooLong, fit_to_window
from gradfuse.generate.local import BUNDLED_GENERATOR, load_local_generator
from gradfuse.generate.openai_http import OpenAICompatibleGenerator
from gradfuse.generate.prompt import EXTRACTIVE, Citation, build_messages, parse_citations

__all__ = ["BUNDLED_GENERATOR", "Citation", "ContextTooLong", "Generator", "build_messages", "describe_generator",
           "fit_to_window", "make_generator", "parse_citations"]


class Generator(Protocol):
    name: str
    context_tokens: int  # the window the prompt and the answer share

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """The prompt's length in tokens (exact for a local model, an estimate for an endpoint)."""

    def generate(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, passages: int = 0) -> str:
        """`passages` > 0 asks the generator to name one of that many passages first, where it can."""

    def stream(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, passages: int = 0) -> Iterator[str]:
        """The same answer in pieces as they are produced; joined and stripped, it is what `generate` returns."""


def make_generator(spec: str = BUNDLED_GENERATOR, *, model: str = "default", context_tokens: int = 8192,
                   api_key_env: str = "") -> Generator:
    """`smollm2` (bundled), a local HF folder or .gguf file, or an http(s) URL of an OpenAI-compatible server
    (whose window, `context_tokens`, we cannot read; a local model's is its own; `api_key_env` names the variable
    holding its key)."""
    if spec.startswith(("http://", "https://")):
        return OpenAICompatibleGenerator(spec, model=model, context_tokens=context_tokens, api_key_env=api_key_env)
    return load_local_generator(spec)


def describe_generator(spec: str) -> str:
    """Who writes the answers, in words a newcomer can weigh them by."""
    if spec == BUNDLED_GENERATOR:
        return ("the bundled SmolLM2-135M-Instruct (135M parameters: fluent, often wrong); for real answers set "
                "[generator] model to a local .gguf file or transformers folder, or an OpenAI-compatible URL")
    if spec.startswith(("http://", "https://")):
        return "an OpenAI-compatible endpoint"
    if spec == EXTRACTIVE:
        return ("no generator: the answer is the passages' own sentences, chosen by the [evidence] scorer (the "
                "default with the bundled SmolLM2-135M, whose own answers held the gold answer less than half as "
                "often; [generator] answer = \"generate\" has it write, or set [generator] model to a larger model)")
    return f"the local model {spec}"
