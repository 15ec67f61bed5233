"""The reader: a cross-encoder trained here from the shipped MiniLM (`make train-reader`, training/reader.py; its
model card is READER.md beside this file) that reads a question with one sentence and gives the logit of "this
sentence answers the question", comparable between the sentences of one question. ONNX Runtime runs it, int8: no
torch at query time. An answer reads it only where the `support` model's fit chose its signal (support.json); it
has not yet, so the package ships no reader (READER.md says where it stands).

The pair's layout (`pair`) is the one it was trained on: change it only together with a retrained model."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import numpy as np

READER_FILE = Path(__file__).with_name("reader.onnx")
MAX_TOKENS = 128  # the question and the sentence together
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def pair(question: str, sentence: str) -> tuple[str, str]:
    """What the reader reads: the question, then the sentence as quoted (its line breaks as spaces). The passage
    around it is not read: with 160 characters each side the reader learnt a third as fast on SQuAD (answer@1 0.31
    against 0.76 after 60 batches), its mean-pooled tokens mostly context, and each pair took 1.5 times as long."""
    return question, " ".join(sentence.split())


def tokenizer(model_path: Path):
    """The encoder's own tokenizer, pairs cut to MAX_TOKENS from the second text (the context) first."""
    from tokenizers import Tokenizer

    loaded = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    loaded.enable_truncation(MAX_TOKENS, strategy="longest_first")
    loaded.enable_padding(pad_id=0, pad_token="[PAD]")
    return loaded


def feeds(encodings) -> dict[str, np.ndarray]:
    return {name: np.array([getattr(e, field) for e in encodings], dtype=np.int64)
            for name, field in zip(_INPUTS, ("ids", "attention_mask", "type_ids"))}


class Reader:
    """The ONNX reader and its tokenizer, loaded once (`load_reader`)."""

    def __init__(self, path: Path = READER_FILE):
        import onnxruntime

        from gradfuse.embedding.encoder import DEFAULT_ENCODER, _model_path

        if not Path(path).is_file():
            raise FileNotFoundError(f"no reader model at {path}: `make train-reader` makes one (reading/READER.md)")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = min(os.cpu_count() or 1, 4)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see embedding/onnx_encoder.py
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._tokenizer = tokenizer(_model_path(DEFAULT_ENCODER))

    def logits(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """One logit per (question, sentence-with-context) pair."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        given = feeds(self._tokenizer.encode_batch(pairs))
        return self._session.run(None, {name: given[name] for name in self._inputs})[0].reshape(-1)


@cache
def load_reader() -> Reader:
    return Reader()


# Sentences one answer's reader reads: half of them those the question's words rank first, half those the
# encoder's cosine ranks first: the cost of an answer stays bounded however long its passages are.
READ_AT_MOST = 12


def to_read(overlap: np.ndarray, cosines: np.ndarray, at_most: int = READ_AT_MOST) -> list[int]:
    """Which sentences the reader reads: the best by word overlap and the best by cosine, in turn, up to `at_most`."""
    chosen: dict[int, None] = {}
    for by_words, by_meaning in zip(np.argsort(-overlap, kind="stable"), np.argsort(-cosines, kind="stable")):
        for i in (int(by_words), int(by_meaning)):
            if len(chosen) < at_most:
                chosen.setdefault(i)
    return sorted(chosen)


def read_every(question: str, sentences: list[str], folder: str = "") -> np.ndarray:
    """Every sentence's logit (the `reader` evidence scorer): by the local model in `folder` (local_reader.py), or
    by the reader trained here."""
    if folder:
        from gradfuse.reading.local_reader import load_local_reader

        return load_local_reader(folder).logits(question, sentences)
    return load_reader().logits([pair(question, s) for s in sentences]).astype(float)


def read(question: str, sentences: list[str], overlap: np.ndarray, cosines: np.ndarray) -> np.ndarray:
    """The reader's logit for the sentences (as quoted) that `to_read` chooses; NaN for the others."""
    values = np.full(len(sentences), np.nan)
    chosen = to_read(overlap, cosines)
    if chosen:
        values[chosen] = load_reader().logits([pair(question, sentences[i]) for i in chosen])
    return values
