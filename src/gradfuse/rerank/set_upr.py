"""Set-level UPR, the exact reference of conditional selection: round r takes the remaining candidate c that
maximises log P(question | chosen + c) (the documents chosen so far, then c, packed as UPR packs one passage), so
with one round it is UPR. PromptRank (Khalifa et al., 2023) scores the question given chains of passages the same
way. Round r costs one forward pass per remaining candidate (n + (n - 1) + ... passes); the final list is the
chosen documents, then the rest in the prior's order."""

from __future__ import annotations

from gradfuse.rerank.base import RerankSettings, Scored, chosen_first
from gradfuse.rerank.lm_scorer import LMScorer


class SetUPRScorer:
    name = "set-upr"

    def __init__(self, lm: LMScorer):
        self.lm = lm

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        rounds = min(settings.set_rounds, k, len(docs))
        chosen, loss = self.lm.greedy_selection(docs, question, question, rounds, target_is_query=True)
        values = chosen_first(chosen, len(docs))
        return Scored({"set_upr": values}, "set_upr", target=question, loss=loss, mixes=False)
