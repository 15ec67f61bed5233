"""Stage 2's signals that read the whole context, on the real SmolLM2: attention calibrated by a content-free
question, the reader gate calibrated by a content-free target, and conditional selection as a set."""

import numpy as np
import pytest

from gradfuse.candidate import Candidate
from gradfuse.rerank import RerankSettings, load_scorer, rerank, score_pool
from gradfuse.rerank.attention import AttentionScorer, layer_window
from gradfuse.rerank.lm_scorer import CONTENT_FREE

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
RELEVANT = "Paris is the capital and largest city of France."
FILLERS = [
    "The Nile is a long river that flows north through Africa.",
    "Bananas are a yellow fruit rich in potassium.",
    "Mount Everest is the tallest mountain above sea level.",
    "The violin is a string instrument played with a bow.",
]


@pytest.fixture(scope="module")
def lm():
    return load_scorer("smollm2", 64)


def test_calibration_removes_the_attention_the_last_position_draws(lm):
    """Raw attention from the question favours whatever passage comes last (recency); minus the attention of the
    content-free question, the relevant passage is first wherever it stands."""
    scorer = AttentionScorer(lm)
    for position in range(len(FILLERS) + 1):
        docs = FILLERS[:position] + [RELEVANT] + FILLERS[position:]
        attention, content_free = scorer.per_layer(QUESTION, docs)
        assert attention.shape == content_free.shape == (lm.model.config.num_hidden_layers, len(docs))
        assert int(np.argmax((attention - content_free).sum(0))) == position
        if position < len(FILLERS):
            assert int(np.argmax(attention.sum(0))) == len(docs) - 1  # the bias calibration removes
    # The scorer's values are that difference summed over the configured window, and every window is kept.
    scored = scorer.score(QUESTION, docs, RerankSettings(attention_layers="middle-half"))
    window = layer_window("middle-half", len(attention))
    assert scored.values["attention"] == pytest.approx((attention - content_free)[window].sum(0), rel=1e-4)
    assert scored.values["attention@middle-half"] == pytest.approx(scored.values["attention"])
    assert {f"attention@{w}" for w in ("all", "first-third", "middle-third", "last-third")} <= set(scored.values)


def test_the_attention_of_the_content_free_query_is_the_same_pass_with_n_a_as_the_question(lm):
    """Both passes share one encoding of the documents: each equals a pass over its own fresh encoding."""
    docs = [FILLERS[0], RELEVANT]
    attention, content_free = AttentionScorer(lm).per_layer(QUESTION, docs)
    alone = lm.query_attention(lm.packer.pack(docs, question=CONTENT_FREE, target=None))
    assert content_free == pytest.approx(alone, rel=1e-4, abs=1e-6)
    assert attention == pytest.approx(lm.query_attention(lm.packer.pack(docs, question=QUESTION, target=None)),
                                      rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("target", ["query", "gold"])
def test_the_calibrated_gate_is_the_gate_minus_the_content_free_targets_gate(lm, target):
    docs = FILLERS[:2] + [RELEVANT]
    settings = RerankSettings(target=target, n=3)
    scored = score_pool("calibrated-gate", QUESTION, docs, settings, gold="Paris")
    query_target = target == "query"
    _, gate = lm.attribute_reader(lm.pack(docs, QUESTION, QUESTION if query_target else "Paris",
                                          target_is_query=query_target))
    _, free = lm.attribute_reader(lm.pack(docs, QUESTION, CONTENT_FREE, target_is_query=query_target))
    assert scored.values["reader_gate"] == pytest.approx(gate, rel=1e-4, abs=1e-6)
    assert scored.values["calibrated_gate"] == pytest.approx(gate - free, rel=1e-4, abs=1e-6)
    assert scored.main == "calibrated_gate" and scored.mixes


def candidates(texts):
    return [Candidate("kb", f"d{i}", text, 0.0, i + 1, scores={"prior": 1.0 - i / 10}) for i, text in
            enumerate(texts)]


@pytest.mark.parametrize("scorer", ["conditional-gate", "set-upr"])
def test_k_rounds_choose_k_different_documents_then_the_rest_follow_the_prior(scorer):
    texts = FILLERS + [RELEVANT, "France is a country in western Europe; its capital city is Paris."]
    for rounds in (1, 3):
        settings = RerankSettings(n=len(texts), set_rounds=rounds)
        outcome = rerank(scorer, QUESTION, candidates(texts), settings, k=10)
        order = [c.doc_id for c in outcome.ranked]
        chosen, rest = order[:rounds], order[rounds:]
        assert len(set(order)) == len(texts)  # nothing chosen twice, nothing lost
        assert rest == [f"d{i}" for i in range(len(texts)) if f"d{i}" not in chosen]  # the prior's order
        assert outcome.target == QUESTION
        if scorer == "set-upr" and rounds == 1:  # one round of set-level UPR is UPR's best document
            upr = score_pool("upr", QUESTION, texts, settings).values["upr"]
            assert chosen == [f"d{int(np.argmax(upr))}"]
    assert RELEVANT in [c.text for c in outcome.ranked[:3]]


def test_each_round_of_the_conditional_gate_reads_the_documents_chosen_before_it(lm):
    """Round r's gate is taken with the chosen documents at full weight and the others at 1/m: a chosen document
    changes what the remaining ones are worth."""
    from gradfuse.rerank.conditional import ConditionalGateScorer

    docs = FILLERS[:2] + [RELEVANT, "France is a country in western Europe; its capital city is Paris."]
    scorer = ConditionalGateScorer(lm)
    packed = lm.pack(docs, QUESTION, QUESTION, target_is_query=True)
    documents = lm.encode_documents(packed)
    first, given = scorer.gates_given(packed, documents, []), scorer.gates_given(packed, documents, [2])
    assert not given[[0, 1, 3]] == pytest.approx(first[[0, 1, 3]], rel=1e-2)
    # the cache is back to the documents alone after each round: a round repeated gives the same values
    assert scorer.gates_given(packed, documents, []) == pytest.approx(first, rel=1e-4, abs=1e-6)
