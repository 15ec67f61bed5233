"""In-context re-ranking (ICR: Chen et al., ICLR 2025): every passage first, the question after them, and a
passage's value is how much the question's tokens attend to its tokens, minus the same attention when the
question is the content-free "N/A" (which removes what a passage's position and length alone draw).

The documents are encoded once (a key/value cache); the question and the "N/A" question are two short passes over
it. Summing every layer hurts small models (Selective-ICR, arXiv 2602.22591), so the layers summed are a window,
`[rerank] attention_layers`; every window's value is kept (`rerank:attention@<window>`), so a benchmark chooses the
window on its dev queries without another pass.
"""

from __future__ import annotations

import numpy as np

from gradfuse.rerank.base import ATTENTION_WINDOWS, RerankSettings, Scored
from gradfuse.rerank.lm_scorer import CONTENT_FREE, LMScorer


def layer_window(name: str, layers: int) -> slice:
    """The layers a window names, for a model of `layers` layers: all, a third of them, or the middle half."""
    third, quarter = layers // 3, layers // 4
    return {"all": slice(0, layers), "first-third": slice(0, third), "middle-third": slice(third, layers - third),
            "last-third": slice(layers - third, layers), "middle-half": slice(quarter, layers - quarter)}[name]


class AttentionScorer:
    name = "attention"

    def __init__(self, lm: LMScorer):
        self.lm = lm

    def per_layer(self, question: str, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(layers, documents) attention of the question's tokens and of "N/A"'s, over one encoding of `docs`."""
        packed = self.lm.packer.pack(docs, question=question, target=None)
        free = self.lm.packer.pack(docs, question=CONTENT_FREE, target=None)
        documents = self.lm.encode_documents(packed)
        return self.lm.query_attention(packed, documents), self.lm.query_attention(free, documents)

    def score(self, question: str, docs: list[str], settings: RerankSettings, *, gold: str | None = None,
              k: int = 10) -> Scored:
        attention, content_free = self.per_layer(question, docs)
        calibrated = attention - content_free
        values = {f"attention@{name}": calibrated[layer_window(name, len(calibrated))].sum(0)
                  for name in ATTENTION_WINDOWS}
        values["attention"] = values[f"attention@{settings.attention_layers}"]
        values["attention_uncalibrated"] = attention[layer_window(settings.attention_layers, len(attention))].sum(0)
        return Scored(values, "attention", target=question)
