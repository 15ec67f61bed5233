"""The reader (reading/reader.py): its inference path on a tiny random model this test exports itself, which
sentences an answer lets it read, how its logits enter the `support` signals, and, where `make train-reader` has
made one, that the trained model reads as its training meant."""

from __future__ import annotations

import numpy as np
import pytest

from gradfuse.reading.reader import READER_FILE, READ_AT_MOST, Reader, load_reader, pair, read, to_read
from gradfuse.reading import support


@pytest.fixture(scope="module")
def tiny_reader(tmp_path_factory):
    """A two-layer BERT with the encoder's vocabulary and the reader's head (training/reader.py's layout: a linear
    head over mean-pooled tokens), random, exported as the reader is."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=64))
            self.head = torch.nn.Linear(32, 1)

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return self.head((hidden * mask).sum(1) / mask.sum(1))

    names = ["input_ids", "attention_mask", "token_type_ids"]
    sample = tuple(torch.ones((2, 5), dtype=torch.long) for _ in names)
    path = tmp_path_factory.mktemp("reader") / "tiny.onnx"
    torch.onnx.export(Tiny().eval(), sample, str(path), input_names=names, output_names=["logit"], opset_version=17,
                      dynamo=False, dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names}, "logit": {0: "batch"}})
    return Reader(path)


def test_the_reader_gives_one_logit_per_pair_whatever_their_lengths(tiny_reader):
    pairs = [pair("Which option keeps the input file?", "-k, --keep\n   Keep (don't delete) input files."),
             pair("Which option keeps the input file?", "word " * 400)]  # cut to MAX_TOKENS, not refused
    logits = tiny_reader.logits(pairs)
    assert logits.shape == (2,) and np.isfinite(logits).all()
    assert pairs[0][1] == "-k, --keep Keep (don't delete) input files."  # read as quoted: line breaks as spaces
    alone = tiny_reader.logits(pairs[:1])  # padding beside a longer pair does not change a logit
    assert np.allclose(alone, logits[:1], atol=1e-4)
    assert tiny_reader.logits([]).shape == (0,)


def test_the_reader_reads_a_bounded_number_of_sentences_chosen_by_words_and_by_meaning():
    overlap = np.array([0.9, 0.1, 0.0, 0.8, 0.0] + [0.0] * 20)
    cosines = np.array([0.1, 0.2, 0.95, 0.1, 0.3] + [0.0] * 20)
    assert to_read(overlap, cosines, at_most=4) == [0, 2, 3, 4]  # words' first, meaning's first, and their seconds
    assert len(to_read(np.zeros(40), np.zeros(40))) == READ_AT_MOST
    assert to_read(np.zeros(3), np.zeros(3)) == [0, 1, 2]


def test_unread_sentences_are_nan_and_the_signal_counts_them_as_the_lowest_read(tiny_reader, monkeypatch):
    monkeypatch.setattr("gradfuse.reading.reader.load_reader", lambda: tiny_reader)
    sentences = [f"sentence number {i} about something" for i in range(READ_AT_MOST + 3)]
    values = read("which sentence", sentences, np.linspace(1, 0, len(sentences)), np.zeros(len(sentences)))
    assert np.isnan(values).sum() == 3 and np.isfinite(values[:READ_AT_MOST]).all()
    texts = ["one sentence here", "another sentence there", "a third sentence"]
    with pytest.raises(ValueError, match="reader"):
        support.signals("which sentence", texts, np.zeros(3), only=("reader",))
    found = support.signals("which sentence", texts, np.zeros(3), only=("reader",),
                            reader=np.array([2.0, np.nan, -1.0]))
    assert found["reader"].tolist() == [2.0, -1.0, -1.0]


@pytest.mark.skipif(not READER_FILE.is_file(), reason="no trained reader here (make train-reader makes one)")
def test_a_trained_reader_is_small_and_prefers_the_sentence_that_answers():
    assert READER_FILE.stat().st_size <= 30 * 2**20  # the limit for weights in the package
    question = "In what year did the Normans conquer England?"
    logits = load_reader().logits([pair(question, s) for s in (
        "The Norman conquest of England took place in 1066.", "Normandy is a region in the north of France.")])
    assert logits[0] > logits[1]


def test_an_answer_reads_its_sentences_where_the_support_model_weighs_the_reader(tiny_reader, monkeypatch, tmp_path):
    """The answer path as it runs once a fit chooses the reader's signal: the evidence of every sentence it read
    carries its logit, the others none, and "not found" reads the best of them."""
    from gradfuse import Workspace
    from gradfuse.candidate import Candidate
    from gradfuse.config import Config

    chosen = support.SupportModel({"overlap": 5.0, "reader": 1.0}, {"reader": 1.0, "overlap": 2.0, "bias": -1.0}, 0.2)
    monkeypatch.setattr(support, "model", lambda: chosen)
    monkeypatch.setattr("gradfuse.reading.reader.load_reader", lambda: tiny_reader)
    text = " ".join(f"Sentence {i} says that the planet number {i} has {i} moons." for i in range(20))
    passages = [Candidate("notes", "planets.md#1", text, 1.0, 1)]
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    evidence = ws.evidence("How many moons has planet number 7?", passages)
    read_ones = [e for e in evidence if e.reading is not None]
    assert len(evidence) == 20 and len(read_ones) == READ_AT_MOST
    expected = tiny_reader.logits([pair("How many moons has planet number 7?", e.quoted()) for e in read_ones])
    assert np.allclose([e.reading for e in read_ones], expected, atol=1e-4)
    chance = ws.support("How many moons has planet number 7?", evidence)
    assert 0.0 < chance < 1.0


def _tiny_classifier(folder, labels: list[str]):
    """A random one-layer BERT sequence classifier (weights wide enough that its outputs vary with the input) with a
    vocabulary of the words below, saved as a Hugging Face folder: what `[evidence] reader` names (a relevance cross-encoder for one label, NLI-style for more)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(0)
    folder.mkdir(exist_ok=True)
    words = "the a of is what which when how star stars moon sun light planet bread oven water salt flour".split()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    config = BertConfig(vocab_size=5 + len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, initializer_range=0.5, num_labels=len(labels), id2label=dict(enumerate(labels)),
                        label2id={name: i for i, name in enumerate(labels)})
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("labels", [["LABEL_0"], ["contradiction", "entailment", "neutral"]])
def test_a_local_reader_folder_scores_every_sentence_of_an_answer_in_the_readers_role(workspace, tmp_path, labels):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from gradfuse.reading.scoring import EvidenceSettings

    folder = str(_tiny_classifier(tmp_path, labels))
    question = "Which star is closest to the sun?"
    passages = workspace.search(question, k=3).candidates
    evidence = workspace.evidence(question, passages, settings=EvidenceSettings(scorer="reader", reader=folder))
    assert len(evidence) >= 3 and [e.score for e in evidence] == sorted((e.score for e in evidence), reverse=True)
    # What the folder's model says of each sentence as the answer quotes it, read here with transformers alone: a
    # relevance model reads (question, sentence); an NLI model (sentence, question), its entailment's log-chance.
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)
    quoted = [e.quoted() for e in evidence]

    def read(firsts, seconds):
        with torch.no_grad():
            logits = model(**tokenizer(firsts, seconds, padding=True, return_tensors="pt")).logits
        return (torch.log_softmax(logits, -1)[:, 1] if len(labels) > 1 else logits[:, 0]).numpy()

    nli = len(labels) > 1
    as_nli, as_relevance = read(quoted, [question] * len(quoted)), read([question] * len(quoted), quoted)
    expected, swapped = (as_nli, as_relevance) if nli else (as_relevance, as_nli)
    assert np.abs(expected - swapped).max() > 1e-3  # the test tells the pair's order
    assert np.allclose([e.score for e in evidence], expected, atol=1e-4)
    assert not nli or max(e.score for e in evidence) < 0  # a log-chance


def test_a_local_reader_is_refused_clearly_where_it_cannot_be_read(tmp_path):
    from gradfuse.reading.local_reader import LocalReader, ReaderFolderError
    from gradfuse.reading.scoring import EvidenceSettings

    with pytest.raises(ValueError, match="reader scorer only"):
        EvidenceSettings(scorer="support", reader=str(tmp_path))
    with pytest.raises(ReaderFolderError, match="config.json"):
        LocalReader(str(tmp_path))
    with pytest.raises(ReaderFolderError, match="none names entailment"):
        LocalReader(str(_tiny_classifier(tmp_path / "two", ["negative", "positive"])))
