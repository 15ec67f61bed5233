"""Stage 2's parts that need no scoring LM: the mix with the prior, the pools, the settings' checks, and the
cross-encoder backend on a tiny model the test builds (no cross-encoder ships in a wheel here)."""

import numpy as np
import pytest

from gradfuse.candidate import Candidate
from gradfuse.rerank import CrossEncoderMissing, RerankSettings, make_scorer, rerank
from gradfuse.rerank.base import combine
from gradfuse.rerank.pools import ordered_pool


def test_zsum_mixes_z_scores_and_within_reorders_only_the_priors_head():
    score, prior = np.array([0.0, 3.0, 1.0, 10.0]), np.array([0.9, 0.8, 0.7, 0.1])
    assert list(np.argsort(-combine(score, prior, mix="zsum", prior_weight=0.0, within_m=3))) == [3, 1, 2, 0]
    assert list(np.argsort(-combine(score, prior, mix="zsum", prior_weight=50.0, within_m=3))) == [0, 1, 2, 3]
    # within 2: documents 0 and 1 (the prior's first two) swap by score; 3's high score cannot lift it
    assert list(np.argsort(-combine(score, prior, mix="within", prior_weight=0.0, within_m=2))) == [1, 0, 2, 3]


def test_settings_name_what_is_wrong():
    for field, value in (("pool", "bm25"), ("mix", "max"), ("estimator", "attention"), ("prior", "cosine"),
                         ("dtype", "float16"), ("attention_layers", "middle"), ("scorer", "loo")):
        with pytest.raises(ValueError, match=f"unknown {field} '{value}'"):
            RerankSettings(**{field: value})
    for field in ("within_m", "set_rounds"):
        with pytest.raises(ValueError, match="at least 1"):
            RerankSettings(**{field: 0})


def test_set_methods_cost_a_pass_a_round_or_every_remaining_candidate_a_round():
    from gradfuse.methods import lm_passes

    assert lm_passes("conditional", 10, 10, 3) == 3 and lm_passes("conditional", 10, 2, 3) == 2
    assert lm_passes("set-upr", 10, 10, 3) == 10 + 9 + 8 and lm_passes("set-upr", 10, 10, 1) == lm_passes("upr", 10, 10)
    assert lm_passes("attention", 10, 10) == 1 and lm_passes("dense", 10, 10) == 0
    assert lm_passes("gro", 10, 10) == 1 and lm_passes("gro", 10, 10, 3, "set-upr") == lm_passes("set-upr", 10, 10)


def test_every_signal_gro_can_run_is_a_scorer_with_a_method_row():
    from gradfuse.methods import spec_of
    from gradfuse.rerank import SCORERS, SIGNALS

    for signal in SIGNALS:
        assert signal in SCORERS and spec_of("gro", signal).scorer == signal


def lists():
    a = [Candidate("a", f"a{i}", f"text a{i}", 10.0 - i, i + 1) for i in range(3)]
    b = [Candidate("b", f"b{i}", f"text b{i}", 5.0 - i, i + 1) for i in range(3)] + \
        [Candidate("b", "dup", "text a0", 1.0, 4)]
    return {"a": a, "b": b}


def test_a_fused_pool_keeps_the_sources_ranking_and_gives_its_score_as_prior():
    pooled = ordered_pool(lists(), "rrf", query_vector=np.zeros(2), embed=None)
    assert [c.key for c in pooled[:2]] == ["a/a0", "b/b0"] and len(pooled) == 6  # a0 found twice: merged, first
    assert pooled[0].scores["prior"] == pooled[0].scores["fusion:rrf"] == pytest.approx(1 / 61 + 1 / 64)
    assert [m.key for m in pooled[0].merged] == ["b/dup"]


def test_the_cosine_pool_orders_by_the_encoders_cosine():
    vectors = {"a/a0": [0.1, 1], "a/a1": [0.9, 0.1], "a/a2": [0.5, 0.5], "b/b0": [1, 0], "b/b1": [0, 1],
               "b/b2": [0.2, 0.2]}
    pooled = ordered_pool(lists(), "cosine", query_vector=np.array([1.0, 0.0]),
                          embed=lambda cs: np.array([vectors[c.key] for c in cs]))
    assert [c.key for c in pooled[:3]] == ["b/b0", "a/a1", "a/a2"]
    assert pooled[0].scores["prior"] == 1.0


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    """A randomly initialised two-layer BERT cross-encoder with a word-level vocabulary, saved as a folder."""
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder = tmp_path_factory.mktemp("cross-encoder")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "vault", "code", "is", "what", "cake", "bake"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    config = BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, num_labels=1)
    model = BertForSequenceClassification(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), CrossEncoder(str(folder), local_files_only=True)


def test_the_cross_encoder_backend_loads_a_local_folder_and_ranks_by_its_scores(tiny_cross_encoder):
    folder, reference = tiny_cross_encoder
    texts = ["the vault code is", "bake the cake", "what is the code"]
    candidates = [Candidate("kb", f"d{i}", t, 0.0, i + 1, scores={"prior": 1 - i / 10}) for i, t in enumerate(texts)]
    settings = RerankSettings(cross_encoder=folder, prior_weight=0.0)
    outcome = rerank("cross-encoder", "what is the vault code", candidates, settings)
    expected = reference.predict([("what is the vault code", t) for t in texts])
    assert [c.text for c in outcome.ranked] == [texts[i] for i in np.argsort(-expected, kind="stable")]
    assert [c.scores["rerank:cross_encoder"] for c in candidates] == pytest.approx(expected.tolist(), rel=1e-5)


def test_the_cross_encoder_without_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(CrossEncoderMissing, match="none ships with gradfuse"):
        make_scorer("cross-encoder", RerankSettings())
    with pytest.raises(CrossEncoderMissing, match="is not a folder with a model's config.json"):
        make_scorer("cross-encoder", RerankSettings(cross_encoder=str(tmp_path)))
