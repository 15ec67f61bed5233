"""Conditional selection as a set, greedy, with the one-pass estimate: round r keeps the r - 1 documents chosen so
far in the context and takes the remaining candidate whose reader gate (the first-order rise of the query's loss
as attention to it is turned down, see lm_scorer.py) is largest *given them*.

The target is the question itself (query likelihood, as set-upr.py's exact reference scores it). All candidates
stay packed in the prior's order and are encoded once; what changes between rounds is where the gradient is
taken: the chosen documents' gates at 1, each remaining one's at 1/m (m of them, so together they weigh about one
document). The gradient there says which candidate, turned up, lowers the loss most next to the chosen ones, and a
bridge paragraph that only helps beside its partner can win once the partner is chosen. Each round is one short
backward pass over the question; the final list is the chosen documents, then the rest in the prior's order.
"""

from __future__ import annotations

import numpy as np

from gradfuse.rerank.base import RerankSettings, Scored, chosen_first
from gradfuse.rerank.lm_scorer import LMScorer


class ConditionalGateScorer:
    name = "conditional-gate"

    def __init__(self, lm: LMScorer):
        self.lm = lm

    def gates_given(self, packed, documents, chosen: list[int]) -> np.ndarray:
        """Each document's reader gate with `chosen` in the context and the others turned down to 1/m."""
        remaining = len(packed.doc_spans) - len(chosen)
        log_alpha = np.full(len(packed.doc_spans), -np.log(max(remaining, 1)))
        log_alpha[chosen] = 0.0
        return self.lm.attribute_reader(packed, documents, log_alpha=log_alpha)[1]

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        packed = self.lm.pack(docs, question, question, target_is_query=True)
        documents = self.lm.encode_documents(packed)
        chosen: list[int] = []
        for _ in range(min(settings.set_rounds, k, len(docs))):
            gate = self.gates_given(packed, documents, chosen)
            remaining = [i for i in range(len(docs)) if i not in chosen]
            chosen.append(max(remaining, key=lambda i: gate[i]))
        values = chosen_first(chosen, len(docs))
        return Scored({"conditional_gate": values}, "conditional_gate", target=question, mixes=False)
