"""A pointwise relevance prompt: each passage with the question, "is the document relevant? Answer yes or no",
scored by log P(yes) - log P(no) for the next token (the order of P(yes) among the two answers)."""

from __future__ import annotations

from gradfuse.rerank.base import RerankSettings, Scored
from gradfuse.rerank.lm_scorer import LMScorer


class RelevancePromptScorer:
    name = "relevance"

    def __init__(self, lm: LMScorer):
        self.lm = lm
        self.answers = [self._tokens(("Yes", "yes", " Yes", " yes")), self._tokens(("No", "no", " No", " no"))]

    def _tokens(self, words: tuple[str, ...]) -> list[int]:
        ids = {tuple(self.lm.tokenizer.encode(w, add_special_tokens=False)) for w in words}
        return sorted({i[0] for i in ids if len(i) == 1})

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        prompts = [self.lm.packer.relevance_prompt(doc, question) for doc in docs]
        log_probs = self.lm.next_token_log_probs(prompts, self.answers)
        return Scored({"relevance": log_probs[:, 0] - log_probs[:, 1]}, "relevance")
