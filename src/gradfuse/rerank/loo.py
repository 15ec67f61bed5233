"""The references the gradient approximates, with the same LM and target: exact leave-one-out (n + 1 forward
passes) and greedy loss-minimising selection of k documents (about n k passes)."""

from __future__ import annotations

from gradfuse.rerank.base import RerankSettings, Scored, chosen_first
from gradfuse.rerank.lm_scorer import TargetScorer


class LeaveOneOutScorer(TargetScorer):
    """L(C without i) - L(C) for each document."""

    name = "loo"

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        target, target_seconds = self.target(settings, question, docs, gold)
        loss, deltas = self.lm.leave_one_out(docs, question, target, target_is_query=settings.target == "query")
        return Scored({"loo": deltas}, "loo", target, loss, target_seconds, mixes=False)


class GreedyLossScorer(TargetScorer):
    """Forward selection of k documents minimising L (the expensive oracle); the rest follow in pool order."""

    name = "loo-greedy"

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        target, target_seconds = self.target(settings, question, docs, gold)
        chosen, loss = self.lm.greedy_selection(docs, question, target, k,
                                                target_is_query=settings.target == "query")
        values = chosen_first(chosen, len(docs))
        return Scored({"loo_greedy": values}, "loo_greedy", target, loss, target_seconds, mixes=False)
