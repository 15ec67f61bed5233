"""The per-query method on real models: stage 1 on a constructed case, stage 2 on a planted fact."""

import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.candidate import Candidate
from gradfuse.config import Config
from gradfuse.rerank import RerankSettings, rerank
from gradfuse.selection import SelectionSettings, select_sources
from gradfuse.embedding.encoder import load_encoder

from conftest import write_jsonl

QUESTION = "What is the access code for the Zorbex vault?"
PLANTED = "The access code for the Zorbex vault is 4817, set by the night guard in March."
DISTRACTORS = [
    "The Zorbex company was founded in a small garage and later moved to a larger office.",
    "Vaults in old banks were made of thick steel and concrete to resist drilling.",
    "The night guard walks around the building every two hours and checks each door.",
    "March is the third month of the year and has thirty-one days.",
    "Access to the library requires a student card issued at the front desk.",
]


def test_stage1_picks_the_source_with_the_answer_and_drops_its_duplicate():
    encoder = load_encoder()
    sources = {
        "vault-docs": [PLANTED, "The Zorbex vault is opened with a four-digit access code.",
                       "Only the night guard of Zorbex knows the vault code."],
        "vault-mirror": ["The Zorbex vault's access code is 4817; the night guard set it in March.",
                         "The Zorbex vault opens with a four-digit access code.",
                         "Only Zorbex's night guard knows the code of the vault."],
        "recipes": ["Whisk two eggs with sugar until pale.", "Bake the cake for forty minutes at 180 degrees.",
                    "Let the bread dough rise for an hour."],
        "security": ["Security staff rotate shifts so that a guard is always on duty.",
                     "Four-digit codes offer ten thousand combinations.", DISTRACTORS[1]],
    }
    vectors = {name: encoder.encode(texts) for name, texts in sources.items()}
    decision = select_sources(encoder.encode([QUESTION])[0], vectors,
                              SelectionSettings(redundancy_weight=1.0, threshold=0.2, max_sources=3))
    assert decision.sources[0] in ("vault-docs", "vault-mirror")
    twin = "vault-mirror" if decision.sources[0] == "vault-docs" else "vault-docs"
    assert twin not in decision.sources and "redundancy penalty" in decision.dropped[twin]
    assert "recipes" not in decision.sources and "recipes" in decision.dropped
    assert decision.relevance["recipes"] < decision.relevance["security"] < decision.relevance["vault-docs"]
    assert decision.chosen[0].penalty == 0 and decision.chosen[0].gain == decision.chosen[0].relevance


def test_copies_tell_a_copy_from_a_source_that_completes_the_answer():
    """Two sources on the vault: one repeats the planted passages, one holds the rest of the answer. The method's
    similarity penalises both alike; `copies` penalises only the copy (issue 60, results/overlap)."""
    encoder = load_encoder()
    docs = [PLANTED, "The Zorbex vault is opened with a four-digit access code.",
            "Only the night guard of Zorbex knows the vault code."]
    sources = {"vault-docs": docs, "vault-copy": [text + " (archived)" for text in docs],
               "vault-staff": ["The night guard of Zorbex is called Edda Morn and works from ten to six.",
                               "Edda Morn changes the Zorbex vault code every spring.",
                               "Zorbex hired its first night guard in 1998."]}
    vectors = {name: encoder.encode(texts) for name, texts in sources.items()}
    query = encoder.encode(["Who sets the Zorbex vault code, and what is it?"])[0]
    copies = SelectionSettings(redundancy_weight=1.0, threshold=0.1, max_sources=2, redundancy="copies")
    decision = select_sources(query, vectors, copies)
    assert decision.redundancy["vault-docs"]["vault-copy"] > 0.8 > 0.1 > decision.redundancy["vault-docs"]["vault-staff"]
    assert set(decision.sources) == {"vault-docs", "vault-staff"} or set(decision.sources) == {"vault-copy",
                                                                                               "vault-staff"}
    similar = select_sources(query, vectors, SelectionSettings(redundancy_weight=1.0, redundancy="similarity"))
    assert similar.redundancy["vault-docs"]["vault-staff"] > 0.4  # a source on the same topic looks redundant
    with pytest.raises(ValueError, match="unknown redundancy"):
        SelectionSettings(redundancy="topics")


def candidates(texts):
    return [Candidate("kb", f"d{i}", text, 0.0, i + 1, scores={"prior": 1.0 - i / 10}) for i, text in
            enumerate(texts)]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gate", "reader_gate", "grad_x_input"])
def test_stage2_puts_the_planted_fact_on_top_with_the_gold_target(estimator):
    texts = DISTRACTORS[:3] + [PLANTED] + DISTRACTORS[3:]
    settings = RerankSettings(estimator=estimator, target="gold", prior_weight=0.0)  # the gradient alone
    outcome = rerank("gradient", QUESTION, candidates(texts), settings, gold="4817")
    assert outcome.ranked[0].text == PLANTED, [(c.doc_id, c.scores) for c in outcome.ranked]
    assert outcome.target == "4817" and outcome.score_key == f"rerank:{estimator}"
    assert all({outcome.score_key, "rerank:final"} <= set(c.scores) for c in outcome.ranked)


@pytest.mark.slow
def test_leave_one_out_agrees_that_the_planted_fact_matters_most():
    texts = DISTRACTORS[:2] + [PLANTED] + DISTRACTORS[2:4]
    settings = RerankSettings(target="gold")
    outcome = rerank("loo", QUESTION, candidates(texts), settings, gold="4817")
    assert outcome.ranked[0].text == PLANTED and outcome.ranked[0].scores["rerank:loo"] > 0


@pytest.mark.slow
def test_upr_puts_the_planted_fact_on_top_and_the_relevance_prompt_ranks_by_its_score():
    texts = DISTRACTORS[:3] + [PLANTED] + DISTRACTORS[3:]
    settings = RerankSettings(prior_weight=0.0)
    outcome = rerank("upr", QUESTION, candidates(texts), settings)
    assert outcome.ranked[0].text == PLANTED, [(c.doc_id, c.scores) for c in outcome.ranked]
    assert outcome.score_key == "rerank:upr" and outcome.scorer == "upr" and outcome.target == QUESTION
    # The 135M model's yes/no judgement does not find the planted fact here (it prefers a passage about March):
    # only the mechanics are asserted; benchmarks measure its quality.
    outcome = rerank("relevance", QUESTION, candidates(texts), settings)
    values = [c.scores["rerank:relevance"] for c in outcome.ranked]
    assert values == sorted(values, reverse=True) and outcome.target is None and outcome.loss is None


@pytest.mark.slow
def test_the_draft_shares_the_documents_cache_with_the_reader_gate_pass():
    """A draft made from the documents' cache, and the pass reusing that cache, give what separate passes give."""
    from gradfuse.rerank import load_scorer

    lm = load_scorer("smollm2", 64)
    docs = DISTRACTORS[:2] + [PLANTED]
    documents = lm.encode_documents(lm.packer.pack(docs, question=QUESTION, target=None))
    shared_draft = lm.draft(docs, QUESTION, max_new_tokens=12, documents=documents)
    assert shared_draft == lm.draft(docs, QUESTION, max_new_tokens=12)
    packed = lm.pack(docs, QUESTION, shared_draft)
    shared_loss, shared_gate = lm.attribute_reader(packed, documents)
    loss, gate = lm.attribute_reader(packed)
    assert shared_loss == pytest.approx(loss, rel=1e-5) and shared_gate == pytest.approx(gate, rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_gro_end_to_end_over_sources_with_explanation(tmp_path):
    write_jsonl(tmp_path / "vault.jsonl", [{"id": "code", "text": PLANTED}, {"id": "lib", "text": DISTRACTORS[4]}])
    write_jsonl(tmp_path / "misc.jsonl", [{"id": f"m{i}", "text": t} for i, t in enumerate(DISTRACTORS[:4])])
    ws = Workspace(Config(workspace=tmp_path / "ws", k=3))
    ws.index(SourceSpec("vault", "jsonl", str(tmp_path / "vault.jsonl")))
    ws.index(SourceSpec("misc", "jsonl", str(tmp_path / "misc.jsonl")))
    result = ws.search(QUESTION, method="gro", retrieval="dense", target="query", n=4, scorer="gradient")
    assert result.selection is not None and "vault" in result.selection.sources
    assert result.rerank is not None and result.rerank.target == QUESTION
    assert {c.source for c in result.candidates} <= set(result.selection.sources) and "lm_pass" in result.timings
    for candidate in result.candidates:
        assert {"prior", "rerank:reader_gate", "rerank:final"} <= set(candidate.scores)
    fused = ws.search(QUESTION, method="upr", retrieval="dense", n=4, pool="rrf")
    assert fused.rerank.scorer == "upr" and all("fusion:rrf" in c.scores for c in fused.candidates)
    # gro's signal is a setting: with UPR it ranks as the upr method does, and takes no target then
    by_upr = ws.search(QUESTION, method="gro", retrieval="dense", n=4, pool="rrf", scorer="upr", target="gold")
    assert by_upr.rerank.scorer == "upr" and [c.key for c in by_upr.candidates] == [c.key for c in fused.candidates]
    # which is its default (results/stage2/defaults.md): no signal named, gro ranks as with scorer="upr"
    default = ws.search(QUESTION, method="gro", retrieval="dense", n=4, pool="rrf")
    assert default.rerank.scorer == "upr" and [c.key for c in default.candidates] == [c.key for c in by_upr.candidates]
    dense = ws.search(QUESTION, method="dense", retrieval="dense")
    assert [c.scores["prior"] for c in dense.candidates] == sorted((c.scores["prior"] for c in dense.candidates),
                                                                   reverse=True)


def test_soft_selection_keeps_a_weaker_source_and_weighs_its_passages_down(tmp_path):
    """Hard selection drops a source below the threshold with its one relevant passage; soft keeps it, each passage
    scored by its cosine minus the weight times how far its source's gain is below the best (issue 60)."""
    write_jsonl(tmp_path / "vault.jsonl", [{"id": "code", "text": PLANTED},
                                           {"id": "open", "text": "The Zorbex vault opens with a four-digit code."}])
    write_jsonl(tmp_path / "misc.jsonl", [{"id": f"m{i}", "text": t} for i, t in enumerate(DISTRACTORS)])
    ws = Workspace(Config(workspace=tmp_path / "ws", k=10))
    ws.index(SourceSpec("vault", "jsonl", str(tmp_path / "vault.jsonl")))
    ws.index(SourceSpec("misc", "jsonl", str(tmp_path / "misc.jsonl")))
    hard = ws.search(QUESTION, method="select", retrieval="dense",
                     selection=SelectionSettings(threshold=0.9, redundancy_weight=0.0))
    assert hard.selection.sources == ["vault"] and {c.source for c in hard.candidates} == {"vault"}
    # margin 2: no source can fall that far below the best (the default, 0.2, drops a source far below it)
    soft = SelectionSettings(choice="soft", soft_weight=0.5, soft_margin=2.0, threshold=0.9, max_sources=1)
    result = ws.search(QUESTION, method="select", retrieval="dense", selection=soft)
    assert result.selection.sources == ["vault", "misc"] and not result.selection.dropped  # no threshold, no limit
    gains = {step.source: step.gain for step in result.selection.chosen}
    for candidate in result.candidates:
        below = gains[candidate.source] - gains["vault"]
        assert candidate.scores["source_gain"] == pytest.approx(below)
        assert candidate.scores["prior"] == pytest.approx(candidate.scores["cosine"] + 0.5 * below)
    assert [c.scores["prior"] for c in result.candidates] == sorted((c.scores["prior"] for c in result.candidates),
                                                                    reverse=True)
    assert result.candidates[0].doc_id == "code" and {c.source for c in result.candidates} == {"vault", "misc"}
    # weight 0 is dense over every source; a margin drops only a source far below the best
    flat = ws.search(QUESTION, method="select", retrieval="dense", selection=SelectionSettings(choice="soft",
                                                                                                soft_weight=0.0,
                                                                                                soft_margin=2.0))
    dense = ws.search(QUESTION, method="dense", retrieval="dense")
    assert [c.key for c in flat.candidates] == [c.key for c in dense.candidates]
    margin = gains["vault"] - gains["misc"]
    narrow = ws.search(QUESTION, method="select", retrieval="dense",
                       selection=SelectionSettings(choice="soft", soft_margin=margin / 2))
    assert narrow.selection.sources == ["vault"] and "soft_margin" in narrow.selection.dropped["misc"]
    with pytest.raises(ValueError, match="unknown choice"):
        SelectionSettings(choice="maybe")
