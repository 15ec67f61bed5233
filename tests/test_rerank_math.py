"""Both gradient estimators against finite differences, and batched leave-one-out against direct passes.

A tiny randomly initialised Llama (float64, so finite differences are precise) with the real SmolLM2 tokenizer.
"""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from gradfuse.lm.models import bundled_gguf
from gradfuse.rerank.lm_scorer import LMScorer

DOCS = [
    "The Eiffel Tower is in Paris and was finished in 1889.",
    "Bananas are rich in potassium.",
    "Paris is the capital of France, on the Seine.",
    "A short one.",
]
QUESTION, TARGET = "Where is the Eiffel Tower?", "It is in Paris."
EPSILON = 1e-4
# Central differences in float64 are accurate to about EPSILON**2 relative; the bound leaves room for rounding.
RELATIVE_TOLERANCE = 1e-5


def _rms_norm_in_input_precision(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(scope="module")
def scorer():
    # Llama's RMSNorm always normalises in float32, which puts a 1e-7 noise floor under the float64 model and
    # swamps central differences; the same formula in the input's precision makes the check exact.
    patch = pytest.MonkeyPatch()
    patch.setattr(LlamaRMSNorm, "forward", _rms_norm_in_input_precision)
    gguf = bundled_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    yield LMScorer(LlamaForCausalLM(config).double(), tokenizer, doc_tokens=24, batch_tokens=400)
    patch.undo()


def loss_with(scorer, packed, *, scale_doc=None, scale=1.0, log_alpha=None):
    ids = packed.input_ids
    with torch.no_grad():
        embeddings = scorer.model.get_input_embeddings()(ids).clone()[None]
        if scale_doc is not None:
            start, end = packed.doc_spans[scale_doc]
            embeddings[0, start:end] *= scale
        alpha = log_alpha if log_alpha is not None else torch.zeros(len(packed.doc_spans), dtype=torch.float64)
        mask = scorer._gated_causal_mask(packed.length, packed.doc_spans, alpha, embeddings.dtype)
        return float(scorer._target_loss(embeddings, mask, packed))


def test_grad_x_input_matches_finite_differences_of_scaled_embeddings(scorer):
    packed = scorer.pack(DOCS, QUESTION, TARGET)
    attribution = scorer.attribute(packed)
    assert attribution.loss == pytest.approx(loss_with(scorer, packed), rel=1e-12)
    for i in range(len(DOCS)):
        up = loss_with(scorer, packed, scale_doc=i, scale=1 + EPSILON)
        down = loss_with(scorer, packed, scale_doc=i, scale=1 - EPSILON)
        directional = (up - down) / (2 * EPSILON)  # d L(E + t E_i) / dt = <dL/dE_i, E_i>
        assert -directional == pytest.approx(attribution.grad_x_input[i], rel=RELATIVE_TOLERANCE, abs=1e-9)


def test_gate_matches_finite_differences_of_log_alpha(scorer):
    packed = scorer.pack(DOCS, QUESTION, TARGET)
    attribution = scorer.attribute(packed)
    for i in range(len(DOCS)):
        shift = torch.zeros(len(DOCS), dtype=torch.float64)
        shift[i] = EPSILON
        derivative = (loss_with(scorer, packed, log_alpha=shift) - loss_with(scorer, packed, log_alpha=-shift)) / (
            2 * EPSILON)
        assert -derivative == pytest.approx(attribution.gate[i], rel=RELATIVE_TOLERANCE, abs=1e-9)
    assert attribution.doc_lengths.tolist() == [e - s for s, e in packed.doc_spans]


def test_gate_at_alpha_one_leaves_the_model_unchanged(scorer):
    packed = scorer.pack(DOCS, QUESTION, TARGET)
    with torch.no_grad():
        plain = scorer.model(input_ids=packed.input_ids[None]).logits[0, -1]
        embeddings = scorer.model.get_input_embeddings()(packed.input_ids)[None]
        mask = scorer._gated_causal_mask(packed.length, packed.doc_spans, torch.zeros(len(DOCS), dtype=torch.float64),
                                         torch.float64)
        gated = scorer.model(inputs_embeds=embeddings, attention_mask=mask).logits[0, -1]
    assert torch.allclose(plain, gated, atol=1e-10)


def test_batched_leave_one_out_matches_direct_single_passes(scorer):
    full, deltas = scorer.leave_one_out(DOCS, QUESTION, TARGET)  # batch of 5 contexts of different lengths
    assert full == pytest.approx(loss_with(scorer, scorer.pack(DOCS, QUESTION, TARGET)), rel=1e-9)
    for i in range(len(DOCS)):
        without = loss_with(scorer, scorer.pack(DOCS[:i] + DOCS[i + 1:], QUESTION, TARGET))
        assert deltas[i] == pytest.approx(without - full, rel=1e-7, abs=1e-10)


def test_batched_upr_with_its_shared_opening_computed_once_matches_direct_passes(scorer):
    from gradfuse.rerank.lm_scorer import _shared_prefix
    from gradfuse.rerank.upr import UPRScorer

    contexts = [scorer.pack([doc], QUESTION, QUESTION, target_is_query=True) for doc in DOCS]
    assert _shared_prefix([c.input_ids for c in contexts], 1) >= 16  # the opening is reused, not recomputed
    values = UPRScorer(scorer).values(QUESTION, DOCS)  # several batches of different lengths, left-padded
    direct = [-loss_with(scorer, context) for context in contexts]
    assert values == pytest.approx(direct, rel=1e-9)


def test_query_target_packs_the_question_as_what_is_scored(scorer):
    packed = scorer.pack(DOCS, QUESTION, QUESTION, target_is_query=True)
    start, end = packed.target_span
    assert scorer.tokenizer.decode(packed.input_ids[start:end]) == QUESTION
    assert QUESTION not in scorer.tokenizer.decode(packed.input_ids[:start])
    assert len(packed.doc_spans) == len(DOCS)


def reader_loss_with(scorer, packed, log_alpha):
    """L with the gate only on the attention of the positions after the last document (the reader gate)."""
    split = packed.doc_spans[-1][1]
    with torch.no_grad():
        embeddings = scorer.model.get_input_embeddings()(packed.input_ids)[None]
        gated = scorer._gated_causal_mask(packed.length, packed.doc_spans, log_alpha, torch.float64)
        plain = scorer._gated_causal_mask(packed.length, packed.doc_spans, torch.zeros_like(log_alpha), torch.float64)
        mask = torch.cat([plain[:, :, :split], gated[:, :, split:]], dim=2)
        return float(scorer._target_loss(embeddings, mask, packed))


def test_reader_gate_matches_finite_differences_of_the_readers_log_alpha(scorer):
    packed = scorer.pack(DOCS, QUESTION, TARGET)
    loss, gate = scorer.attribute_reader(packed)
    assert loss == pytest.approx(loss_with(scorer, packed), rel=1e-10)
    for i in range(len(DOCS)):
        shift = torch.zeros(len(DOCS), dtype=torch.float64)
        shift[i] = EPSILON
        derivative = (reader_loss_with(scorer, packed, shift) - reader_loss_with(scorer, packed, -shift)) / (
            2 * EPSILON)
        assert -derivative == pytest.approx(gate[i], rel=RELATIVE_TOLERANCE, abs=1e-9)
    # It differs from the full gate, which also turns down what later documents read of document i.
    assert not scorer.attribute(packed).gate == pytest.approx(gate, rel=1e-3)


def test_upr_and_relevance_passes_score_each_passage_alone(scorer):
    from gradfuse.rerank.relevance import RelevancePromptScorer
    from gradfuse.rerank.upr import UPRScorer

    upr = UPRScorer(scorer).values(QUESTION, DOCS)
    alone = [-loss_with(scorer, scorer.pack([doc], QUESTION, QUESTION, target_is_query=True)) for doc in DOCS]
    assert upr == pytest.approx(alone, rel=1e-9)
    relevance = RelevancePromptScorer(scorer)
    with torch.no_grad():
        prompt = scorer.packer.relevance_prompt(DOCS[0], QUESTION)
        log_probs = torch.log_softmax(scorer.model(input_ids=prompt[None]).logits[0, -1], -1)
    expected = float(torch.logsumexp(log_probs[relevance.answers[0]], 0) - torch.logsumexp(log_probs[relevance.answers[1]], 0))
    assert relevance.score(QUESTION, DOCS[:1], None).values["relevance"][0] == pytest.approx(expected, rel=1e-9)
    assert scorer.tokenizer.decode(prompt).count(DOCS[0]) == 1


def test_recorded_attention_is_the_models_own_attention_and_leaves_its_output_unchanged(scorer):
    """query_attention against transformers' eager attention over the whole sequence (output_attentions)."""
    packed = scorer.packer.pack(DOCS, question=QUESTION, target=None)
    recorded = scorer.query_attention(packed)
    scorer.model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            output = scorer.model(input_ids=packed.input_ids[None], output_attentions=True)
    finally:
        scorer.model.set_attn_implementation("gradfuse_gated_sdpa")
    start, end = packed.question_span
    for layer, attention in enumerate(output.attentions):  # (1, heads, T, T)
        rows = attention[0, :, start:end].mean(dim=(0, 1))
        expected = [float(rows[s:e].sum()) for s, e in packed.doc_spans]
        assert recorded[layer] == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert scorer.tokenizer.decode(packed.input_ids[start:end]).strip() == QUESTION
    from gradfuse.rerank.lm_scorer import recording_attention

    with torch.no_grad():
        plain = scorer.model(input_ids=packed.input_ids[None]).logits
        with recording_attention(slice(0, 1)):
            while_recording = scorer.model(input_ids=packed.input_ids[None]).logits
    assert torch.allclose(plain, while_recording, atol=1e-10)


def test_the_conditional_gate_is_the_reader_gate_taken_where_the_unchosen_documents_are_turned_down(scorer):
    """Round 2's gate (document 0 chosen) against finite differences of L around log alpha = (0, -log 3, ...)."""
    from gradfuse.rerank.conditional import ConditionalGateScorer

    packed = scorer.pack(DOCS, QUESTION, QUESTION, target_is_query=True)
    gate = ConditionalGateScorer(scorer).gates_given(packed, scorer.encode_documents(packed), [0])
    point = torch.tensor([0.0] + [-float(np.log(3))] * 3, dtype=torch.float64)
    for i in range(len(DOCS)):
        shift = torch.zeros(len(DOCS), dtype=torch.float64)
        shift[i] = EPSILON
        derivative = (reader_loss_with(scorer, packed, point + shift) - reader_loss_with(scorer, packed, point - shift)
                      ) / (2 * EPSILON)
        assert -derivative == pytest.approx(gate[i], rel=RELATIVE_TOLERANCE, abs=1e-9)


def test_set_upr_chooses_by_the_query_likelihood_of_the_chosen_set_computed_by_hand(scorer):
    """Three documents, two rounds: each round's choice from direct single passes over every candidate set."""
    from gradfuse.rerank import RerankSettings
    from gradfuse.rerank.set_upr import SetUPRScorer

    docs = DOCS[:3]

    def log_likelihood(chosen):  # log P(question | chosen), by one plain pass over the packed text
        packed = scorer.pack([docs[i] for i in chosen], QUESTION, QUESTION, target_is_query=True)
        return -loss_with(scorer, packed)

    first = max(range(3), key=lambda i: log_likelihood([i]))
    second = max((i for i in range(3) if i != first), key=lambda i: log_likelihood([first, i]))
    scored = SetUPRScorer(scorer).score(QUESTION, docs, RerankSettings(set_rounds=2), k=10)
    order = list(np.argsort(-scored.values["set_upr"], kind="stable"))
    assert order[:2] == [first, second] and not scored.mixes
    assert scored.loss == pytest.approx(-log_likelihood([first, second]), rel=1e-9)
