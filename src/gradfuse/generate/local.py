"""A local causal LM through transformers: the bundled SmolLM2 GGUF, any HF model folder, or a GGUF file."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

from gradfuse.generate.llamacpp import LlamaCppUnavailable, load_llamacpp
from gradfuse.lm.models import BUNDLED_GENERATOR, gguf_file, load_tokenizer, load_transformers, model_lock
from gradfuse.loading import loaded_once


class LocalGenerator:
    """Greedy decoding; parameters frozen. One generation at a time per loaded model (a lock): torch already
    uses every core for one request, so running two at once would only slow both."""

    def __init__(self, spec: str = BUNDLED_GENERATOR):
        """A GGUF file runs in llama.cpp where it is installed; anything else, or a GGUF without it, in
        transformers."""
        import torch

        self.name = spec
        self.llamacpp = None
        if (gguf := gguf_file(spec)) is not None:
            try:
                self.llamacpp = load_llamacpp(str(gguf))
            except LlamaCppUnavailable:
                pass  # transformers generates, slower
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.llamacpp is not None:  # transformers is only needed for the chat template
            self.tokenizer, self.model = load_tokenizer(spec), None
            self.context_tokens = self.llamacpp.context_tokens
            return
        self.tokenizer, self.model = load_transformers(spec)
        self._lock = model_lock(self.model)  # llama.cpp has its own
        self.context_tokens = self.model.config.max_position_embeddings
        self.model.eval()
        self.model.requires_grad_(False)
        if self.device != "cpu" and self.model.device.type == "cpu":  # .to("cpu") trips on the GGUF loader's model
            self.model.to(self.device)

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """The prompt's length in this model's own tokens, chat template included."""
        return len(self._prompt_ids(messages))

    def _prompt_ids(self, messages: list[dict[str, str]], reply_prefix: str = "") -> list[int]:
        """The chat prompt as token ids, each message's content tokenised as plain text: "<|im_end|>
        <|im_start|>system" inside a passage stays text (rendered whole and tokenised, it became real turn
        markers). `reply_prefix`: what the reply is made to start with."""
        slots = [{**m, "content": _SLOT.format(i)} for i, m in enumerate(messages)]
        rendered = self.tokenizer.apply_chat_template(slots, add_generation_prompt=True, tokenize=False)
        ids, position = [], 0
        for match in _SLOT_PATTERN.finditer(rendered):
            ids += self._encode(rendered[position : match.start()])
            ids += self._encode(messages[int(match.group(1))]["content"], data=True)
            position = match.end()
        return ids + self._encode(rendered[position:] + reply_prefix)

    def _encode(self, text: str, data: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=data)["input_ids"] if text else []

    def generate(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, passages: int = 0) -> str:
        """Greedy answer. With `passages` > 0 the reply starts by naming one passage, its number constrained to
        1..passages: the bundled 135M model almost never cites on its own (seen on the demo questions), so it is
        made to choose the passage it finds most likely; that choice says nothing about faithfulness."""
        import torch

        if self.llamacpp is not None:
            prompt, prefix = self._llamacpp_prompt(messages, passages)
            return (prefix + self.llamacpp.complete(prompt, max_new_tokens=max_new_tokens,
                                                    continues=bool(prefix))).strip()
        prefix, arguments = self._arguments(messages, max_new_tokens, passages)
        prompt_length = arguments["input_ids"].shape[1]
        with self._lock, torch.inference_mode():
            output = self.model.generate(**arguments)
        completion = self.tokenizer.decode(output[0, prompt_length:], skip_special_tokens=True)
        return (prefix + completion).strip()

    def stream(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, passages: int = 0) -> Iterator[str]:
        """The same greedy answer as `generate`, piece by piece as it is decoded (for server-sent events)."""
        if self.llamacpp is not None:
            yield from self._stream_llamacpp(messages, max_new_tokens, passages)
            return
        import torch
        from transformers import TextIteratorStreamer

        prefix, arguments = self._arguments(messages, max_new_tokens, passages)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        failure: list[BaseException] = []

        def run():
            try:
                with self._lock, torch.inference_mode():
                    self.model.generate(**arguments, streamer=streamer)
            except BaseException as error:  # re-raised in the consumer's thread below
                failure.append(error)
                streamer.end()

        worker = threading.Thread(target=run, name="gradfuse-generate", daemon=True)
        worker.start()
        if prefix:
            yield prefix
        yield from streamer
        worker.join()
        if failure:
            raise failure[0]

    def _llamacpp_prompt(self, messages, passages: int) -> tuple[list[int], str]:
        """(prompt ids, what the reply starts with): with `passages`, the passage number the model finds most
        likely among 1..passages is chosen first (the same constraint as `_FirstTokenAmong`)."""
        if not passages:
            return self._prompt_ids(messages), ""
        numbers = [str(n) for n in range(1, min(passages, 9) + 1)]
        prefix = CITE_FIRST_PREFIX + self.llamacpp.next_token_among(
            self._prompt_ids(messages, CITE_FIRST_PREFIX), numbers)
        return self._prompt_ids(messages, prefix), prefix

    def _stream_llamacpp(self, messages, max_new_tokens: int, passages: int) -> Iterator[str]:
        """llama.cpp decodes in its own thread; pieces come through a queue. When the consumer stops reading (a
        client that left), generation is stopped at the next piece instead of running to max_new_tokens."""
        import queue

        prompt, prefix = self._llamacpp_prompt(messages, passages)
        pieces: queue.Queue = queue.Queue()
        stop = threading.Event()
        failure: list[BaseException] = []

        def run():
            try:
                self.llamacpp.complete(prompt, max_new_tokens=max_new_tokens, continues=bool(prefix),
                                       on_piece=lambda piece: pieces.put(piece) or stop.is_set())
            except BaseException as error:  # re-raised in the consumer's thread below
                failure.append(error)
            finally:
                pieces.put(None)

        worker = threading.Thread(target=run, name="gradfuse-generate", daemon=True)
        worker.start()
        try:
            if prefix:
                yield prefix
            while (piece := pieces.get()) is not None:
                yield piece
        finally:
            stop.set()
        worker.join()
        if failure:
            raise failure[0]

    def _arguments(self, messages, max_new_tokens: int, passages: int) -> tuple[str, dict]:
        from transformers import LogitsProcessorList

        import torch

        prefix = CITE_FIRST_PREFIX if passages else ""
        ids = torch.tensor([self._prompt_ids(messages, prefix)], device=self.device)
        processors = LogitsProcessorList([_FirstTokenAmong(self._number_tokens(passages))] if passages else [])
        return prefix, dict(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            repetition_penalty=1.15,  # the 135M model loops on its own phrases without it
            pad_token_id=self.tokenizer.eos_token_id,
            logits_processor=processors,
        )

    def _number_tokens(self, passages: int) -> list[int]:
        # Tokenizers split digits, so only the numbers 1-9 are one token: the first nine passages can be named.
        ids = [self.tokenizer.encode(str(n), add_special_tokens=False) for n in range(1, min(passages, 9) + 1)]
        return [i[0] for i in ids if len(i) == 1]


CITE_FIRST_PREFIX = "According to passage ["
_SLOT = "\x00GRADFUSE-MESSAGE{}\x00"
_SLOT_PATTERN = re.compile("\x00GRADFUSE-MESSAGE(\\d+)\x00")


class _FirstTokenAmong:
    """A logits processor that allows only `allowed` token ids at the first generated position."""

    def __init__(self, allowed: list[int]):
        self.allowed, self.start = allowed, None

    def __call__(self, input_ids, scores):
        import torch

        if self.start is None:
            self.start = input_ids.shape[1]
        if input_ids.shape[1] == self.start:
            mask = torch.full_like(scores, float("-inf"))
            mask[:, self.allowed] = 0
            scores = scores + mask
        return scores


@loaded_once(maxsize=2)
def load_local_generator(spec: str = BUNDLED_GENERATOR) -> LocalGenerator:
    return LocalGenerator(spec)
