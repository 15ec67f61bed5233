"""A conversation made into one question: chat clients send every turn, and a follow-up ("and in the 2021
release?") means nothing alone. The user's recent turns are joined, oldest first, and that is what is retrieved for
and answered; the assistant's own answers (long, about what was already found) and system prompts (a front end's
instructions, not the question) are left out. Measured against the last turn alone in results/conversation/."""

from __future__ import annotations

RECENT_TURNS = 3  # the user's last turns joined (two-turn cases were measured; three is not tuned)


class ConversationError(ValueError):
    """A conversation gradfuse cannot make a question of (no user turn, content that is not text)."""


def question_of(turns: list[tuple[str, str]], max_chars: int, recent: int = RECENT_TURNS) -> str:
    """`turns` as (role, text), oldest first. The last user turn always; earlier ones while the whole stays within
    `max_chars` (a last turn alone above it is left for the request's own limit to refuse)."""
    said = [text.strip() for role, text in turns if role == "user" and text.strip()]
    if not said:
        raise ConversationError("the conversation has no user message with text")
    kept = [said[-1]]
    for earlier in reversed(said[-recent:-1]):
        if sum(len(t) + 1 for t in kept) + len(earlier) > max_chars:
            break
        kept.insert(0, earlier)
    return "\n".join(kept)
