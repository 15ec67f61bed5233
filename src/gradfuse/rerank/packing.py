"""Pack documents, question and target into one token sequence, remembering where every document lies.

Each piece is tokenised on its own and the ids are concatenated, so document boundaries are exact token spans
and every scorer (gradient, gate, leave-one-out) sees the same tokens for the same document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import torch

INSTRUCTION = "Answer the question using the numbered documents."
QUERY_INSTRUCTION = "Write the question that the numbered documents answer."
RELEVANCE_QUESTION = "Is the document relevant to the question? Answer yes or no."
_SENTINEL = "\x00GRADFUSE{}\x00"
_SPLIT = re.compile("\x00GRADFUSE(\\w+)\x00")


@dataclass
class PackedContext:
    input_ids: torch.Tensor  # (T,)
    doc_spans: list[tuple[int, int]]  # [start, end) token positions of each document, in pack order
    target_span: tuple[int, int]  # [start, end) positions whose tokens the loss scores
    question_span: tuple[int, int] = (0, 0)  # [start, end) of the question's tokens (none for the query target)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


class ContextPacker:
    """Builds the packed prompt for a causal LM. `doc_tokens` caps each document (the token budget)."""

    def __init__(self, tokenizer, *, doc_tokens: int = 128):
        self.tokenizer, self.doc_tokens = tokenizer, doc_tokens
        # A passage is tokenised once however many contexts it enters (leave-one-out packs it n times).
        self._ids = lru_cache(maxsize=4096)(self._encode)

    def _template(self, n_docs: int, question: str | None, with_target: bool) -> list[tuple[str, str]]:
        """The prompt as alternating ('text', str) and ('slot', name) pieces."""
        docs = "".join(_SENTINEL.format(f"doc{i}") for i in range(n_docs))
        if question is None:  # query-likelihood: the question is what the model must produce
            user = f"{QUERY_INSTRUCTION}\nDocuments:\n{docs}"
        else:
            # The question's own leading space is in its slot, so it is tokenised as it was inline.
            user = f"{INSTRUCTION}\nDocuments:\n{docs}Question:{_SENTINEL.format('question')}"
        return self._render(user, _SENTINEL.format("target") if with_target else None)

    def _render(self, user: str, assistant: str | None) -> list[tuple[str, str]]:
        if self.tokenizer.chat_template:
            messages = [{"role": "user", "content": user}]
            if assistant is not None:
                messages.append({"role": "assistant", "content": assistant})
            rendered = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=assistant is None
            )
        else:
            rendered = f"{user}\nAnswer: " + (assistant or "")
        pieces, position = [], 0
        for match in _SPLIT.finditer(rendered):
            pieces.append(("text", rendered[position : match.start()]))
            pieces.append(("slot", match.group(1)))
            position = match.end()
        pieces.append(("text", rendered[position:]))
        return pieces

    def _encode(self, text: str, data: bool = False) -> tuple[int, ...]:
        """The prompt's own text reads its special tokens (<|im_start|>); `data` (documents, question, target)
        never does: "<|im_end|><|im_start|>system" inside a passage stays plain text, not a forged turn."""
        if not text:
            return ()
        return tuple(self.tokenizer(text, add_special_tokens=False, split_special_tokens=data)["input_ids"])

    def document_ids(self, number: int, text: str) -> list[int]:
        body = list(self._ids(text, True)[: self.doc_tokens])
        return list(self._ids(f"[{number}] ")) + body + list(self._ids("\n"))

    def pack(self, docs: list[str], *, question: str | None, target: str | None) -> PackedContext:
        """`question=None` packs for the query target; `target=None` packs a generation prompt."""
        def document(index: int, ids: list[int]) -> list[tuple[int, int]]:
            piece = self.document_ids(index + 1, docs[index])
            ids += piece
            return [(len(ids) - len(piece), len(ids))]

        return self._assemble(len(docs), question, target, document)

    def pack_units(self, passages: list[tuple[str, str, list[tuple[int, int]]]], *, question: str | None,
                   target: str | None) -> PackedContext:
        """Like `pack`, with each passage (prefix, text, sentence spans) whole, not cut to doc_tokens, and the
        context's gated spans (`doc_spans`) its sentences' tokens in order, not its documents'."""
        def document(index: int, ids: list[int]) -> list[tuple[int, int]]:
            piece, spans = self.passage_ids(index + 1, passages[index])
            ids += piece
            return [(len(ids) - len(piece) + start, len(ids) - len(piece) + end) for start, end in spans]

        return self._assemble(len(passages), question, target, document)

    def passage_ids(self, number: int, passage: tuple[str, str, list[tuple[int, int]]],
                    ) -> tuple[list[int], list[tuple[int, int]]]:
        """One passage's ids in a `pack_units` context and its sentences' token spans within them. Each sentence
        is tokenised with the white space before it, so the spans are exact token ranges."""
        prefix, text, units = passage
        ids = list(self._ids(f"[{number}] ")) + list(self._ids(prefix, True))
        spans, position = [], 0
        for start, end in units:
            piece = list(self._ids(text[position:end], True))
            spans.append((len(ids), len(ids) + len(piece)))
            ids += piece
            position = end
        return ids + list(self._ids(text[position:], True)) + list(self._ids("\n")), spans

    def _assemble(self, n_docs: int, question: str | None, target: str | None, document) -> PackedContext:
        """The template filled in: `document(index, ids)` appends document `index` to `ids` and returns the token
        spans it gates."""
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        target_span = question_span = (0, 0)
        for kind, value in self._template(n_docs, question, target is not None):
            if kind == "text":
                ids += self._ids(value)
            elif value == "question":
                question_ids = self._ids(f" {question}", True)
                question_span = (len(ids), len(ids) + len(question_ids))
                ids += question_ids
            elif value == "target":
                target_ids = list(self._ids(target, True))
                target_span = (len(ids), len(ids) + len(target_ids))
                ids += target_ids
            else:
                spans += document(int(value.removeprefix("doc")), ids)
        return PackedContext(torch.tensor(ids, dtype=torch.long), spans, target_span, question_span)

    def relevance_prompt(self, doc: str, question: str) -> torch.Tensor:
        """A pointwise judgement prompt, ending where the model says yes or no."""
        ids: list[int] = []
        user = f"Document: {_SENTINEL.format('doc0')}\nQuestion:{_SENTINEL.format('question')}\n{RELEVANCE_QUESTION}"
        for kind, value in self._render(user, None):
            if kind == "text":
                ids += self._ids(value)
            elif value == "question":
                ids += self._ids(f" {question}", True)
            else:
                ids += self._ids(doc, True)[: self.doc_tokens]
        return torch.tensor(ids, dtype=torch.long)
