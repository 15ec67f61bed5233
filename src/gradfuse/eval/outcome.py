"""The record of one method on one query in an evaluation: what the runner stores and tuning rebuilds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    """One method on one query: the judged ranking and what the method decided on the way."""

    ranking: list[tuple[str, float]]  # (judged document key, score), best first
    chosen: list[str]  # sources the method's ranking draws on
    seconds: float | None  # ranking time (retrieval is shared by all methods and reported apart); None: batch
    head: list[dict] = field(default_factory=list)  # LM methods: the re-ranked candidates and their scores
    target: str | None = None  # LM methods: the text whose likelihood was scored
    loss: float | None = None
    score_key: str | None = None  # LM methods: the score in `head` that ranks (rerank:gate, rerank:upr, ...)
