"""The gradient scorer (GRO-RAG stage 2): one forward + backward pass over the packed pool estimates, for every
document at once, how much the loss of the target would rise without it (see lm_scorer.py for the estimators).

The calibrated gate subtracts the reader gate the content-free target "N/A" gives (as the answer, or as the
question for the query target): gradients in a packed context carry position and length bias, and what a document
earns for no target at all is that bias. Its second pass reuses the documents' encoding."""

from __future__ import annotations

import numpy as np

from gradfuse.rerank.base import RerankSettings, Scored
from gradfuse.rerank.lm_scorer import CONTENT_FREE, TargetScorer


class GradientScorer(TargetScorer):
    name = "gradient"

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        query_target = settings.target == "query"
        documents = None
        if settings.estimator == "reader_gate" and settings.target == "draft" and not settings.both_orders:
            # The draft and the pass read the same documents: they are encoded once, for both (the encoding is
            # counted in the pass's time, not the target's).
            documents = self.encoded_documents(docs, question)
        target, target_seconds = self.target(settings, question, docs, gold, documents)
        orders = [list(range(len(docs)))] + ([list(reversed(range(len(docs))))] if settings.both_orders else [])
        names = ("reader_gate",) if settings.estimator == "reader_gate" else ("gate", "grad_x_input")
        totals = {name: np.zeros(len(docs)) for name in names}
        loss = 0.0
        for order in orders:
            packed = self.lm.pack([docs[i] for i in order], question, target, target_is_query=query_target)
            if settings.estimator == "reader_gate":
                pass_loss, gate = self.lm.attribute_reader(packed, documents)
                values = {"reader_gate": gate}
                lengths = np.array([e - s for s, e in packed.doc_spans])
            else:
                attribution = self.lm.attribute(packed)
                pass_loss, lengths = attribution.loss, attribution.doc_lengths
                values = {"gate": attribution.gate, "grad_x_input": attribution.grad_x_input}
            loss += pass_loss / len(orders)
            for name, value in values.items():
                totals[name][order] += (value / lengths if settings.length_normalise else value) / len(orders)
        return Scored(totals, settings.estimator, target, loss, target_seconds)


class CalibratedGateScorer(TargetScorer):
    """The reader gate minus its value under the content-free target (one order; no length normalisation)."""

    name = "calibrated-gate"

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        query_target = settings.target == "query"
        documents = None
        if settings.target != "query":  # the draft (if any) and both passes read one encoding of the documents
            documents = self.encoded_documents(docs, question)
        target, target_seconds = self.target(settings, question, docs, gold, documents)
        packed = self.lm.pack(docs, question, target, target_is_query=query_target)
        free = self.lm.pack(docs, question, CONTENT_FREE, target_is_query=query_target)
        loss, gate, content_free = self.lm.calibrated_reader_gate(packed, free, documents)
        return Scored({"calibrated_gate": gate - content_free, "reader_gate": gate}, "calibrated_gate", target, loss,
                      target_seconds)
