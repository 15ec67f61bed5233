"""A bigger reader by local path (`[evidence] reader`, read by the `reader` evidence scorer): a Hugging Face
sequence-classification folder read in the role of the reader trained here, one logit per (question, sentence).

Two kinds of model fit that role, told apart by their labels:
- a relevance cross-encoder (one output, ms-marco-MiniLM-L6-v2 and the like): its logit for (question, sentence);
- an NLI or hallucination-detection model (labels that name entailment or support): log P(entailed) with the
  sentence as the premise and the question as the hypothesis.

None ships with gradfuse (no registry holds such weights with a licence we can check); this runs transformers and
torch, which the default answer path does not load."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from gradfuse.loading import loaded_once

_ENTAILED = ("entail", "support", "consistent")  # how NLI and hallucination detectors name the label that agrees
BATCH = 32


class ReaderFolderError(ValueError):
    pass


class LocalReader:
    """A local sequence-classification model as the reader (see above), loaded once per folder (`load_local_reader`)."""

    def __init__(self, folder: str):
        if not (Path(folder) / "config.json").is_file():
            raise ReaderFolderError(f"[evidence] reader: {folder} is not a folder with a model's config.json")
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
        labels = {i: str(name).lower() for i, name in self.model.config.id2label.items()}
        self.entailed = next((i for i, name in labels.items() if name.startswith(_ENTAILED)), None)
        if self.model.config.num_labels > 1 and self.entailed is None:
            raise ReaderFolderError(f"[evidence] reader: {folder} has {self.model.config.num_labels} labels and none "
                                    f"names entailment or support ({', '.join(labels.values())}): gradfuse reads "
                                    "a one-output relevance model or an NLI-style one")
        self._lock = threading.Lock()

    def logits(self, question: str, sentences: list[str]) -> np.ndarray:
        import torch

        if not sentences:
            return np.zeros(0)
        nli = self.entailed is not None
        firsts, seconds = (sentences, [question] * len(sentences)) if nli else ([question] * len(sentences), sentences)
        values = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(sentences), BATCH):
                batch = self.tokenizer(firsts[start:start + BATCH], seconds[start:start + BATCH], truncation=True,
                                       padding=True, return_tensors="pt")
                out = self.model(**batch).logits.float()
                values.append(torch.log_softmax(out, dim=-1)[:, self.entailed] if nli else out[:, 0])
        return torch.cat(values).numpy().astype(float)


@loaded_once(maxsize=2)
def load_local_reader(folder: str) -> LocalReader:
    return LocalReader(folder)
