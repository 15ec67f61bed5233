"""Passages packed to the generator's context window: the prompt and the answer must fit, so the lowest-ranked
whole passages are dropped first (and reported), and a question that does not fit on its own is refused.

An unbounded prompt is not only wrong (the model sees a truncated or overflowing window) but costly: 17,446 tokens
into SmolLM2's 8,192 took 175 s for two tokens here.
"""

from __future__ import annotations

from gradfuse.candidate import Candidate
from gradfuse.generate.prompt import build_messages


PREFIX_ROOM = 16  # "According to passage [n" and the chat template's closing tokens


class ContextTooLong(ValueError):
    """The question and the answer alone are larger than the generator's window."""


def prompt_room(question: str, generator, max_new_tokens: int) -> tuple[int, int]:
    """(the most tokens the whole prompt may take, those it leaves for passages) in `generator`'s window once
    `max_new_tokens` of answer and the cite-first prefix are kept, the rules and the question counted; a question
    that leaves none is refused (`ContextTooLong`)."""
    room = generator.context_tokens - max_new_tokens - PREFIX_ROOM
    alone = generator.count_tokens(build_messages(question, []))
    if alone > room:
        raise ContextTooLong(f"the question takes {alone} tokens, and the generator {generator.name!r} has a window "
                             f"of {generator.context_tokens} tokens with {max_new_tokens} kept for the answer: "
                             "shorten the question or lower max_new_tokens")
    return room, room - alone


def fit_to_window(question: str, passages: list[Candidate], generator, max_new_tokens: int,
                  ) -> tuple[list[dict[str, str]], list[Candidate]]:
    """(the messages, the passages dropped to make them fit): whole passages are kept best first, as many as fit
    with room for `max_new_tokens` (and a few tokens of the cite-first prefix)."""
    room, _ = prompt_room(question, generator, max_new_tokens)
    low, high = 0, len(passages)  # the most passages that fit: a binary search, each probe one tokenisation
    while low < high:
        middle = (low + high + 1) // 2
        if generator.count_tokens(build_messages(question, passages[:middle])) <= room:
            low = middle
        else:
            high = middle - 1
    return build_messages(question, passages[:low]), passages[low:]
