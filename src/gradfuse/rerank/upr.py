"""UPR (Sachan et al., 2022): each passage alone, scored by the LM's likelihood of the query given it,
log P(query | passage) as a mean over the query's tokens; one batched forward pass per few passages."""

from __future__ import annotations

from gradfuse.rerank.base import RerankSettings, Scored
from gradfuse.rerank.lm_scorer import LMScorer


class UPRScorer:
    name = "upr"

    def __init__(self, lm: LMScorer):
        self.lm = lm

    def values(self, question: str, docs: list[str]):
        contexts = [self.lm.pack([doc], question, question, target_is_query=True) for doc in docs]
        return -self.lm.losses(contexts)

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        return Scored({"upr": self.values(question, docs)}, "upr", target=question)
