"""The per-query method on real models: stage 1 on a constructed case, stage 2 on a planted fact."""

import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.candidate import Candidate
from gradfuse.config import Config
from gradfuse.rerank import RerankSettings, gradient_rerank, load_scorer, loo_rerank
from gradfuse.selection import SelectionSettings, select_sources
from gradfuse.sources.encoder import load_encoder

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


def candidates(texts):
    return [Candidate("kb", f"d{i}", text, 0.0, i + 1, scores={"prior": 1.0 - i / 10}) for i, text in
            enumerate(texts)]


@pytest.fixture(scope="module")
def scorer():
    return load_scorer("smollm2")


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gate", "grad_x_input"])
def test_stage2_puts_the_planted_fact_on_top_with_the_gold_target(scorer, estimator):
    texts = DISTRACTORS[:3] + [PLANTED] + DISTRACTORS[3:]
    settings = RerankSettings(estimator=estimator, target="gold", prior_weight=0.0)  # the gradient alone
    outcome = gradient_rerank(scorer, QUESTION, candidates(texts), settings, gold="4817")
    assert outcome.ranked[0].text == PLANTED, [(c.doc_id, c.scores) for c in outcome.ranked]
    assert outcome.target == "4817"
    assert all({"rerank:gate", "rerank:grad_x_input", "rerank:final"} <= set(c.scores) for c in outcome.ranked)


@pytest.mark.slow
def test_leave_one_out_agrees_that_the_planted_fact_matters_most(scorer):
    texts = DISTRACTORS[:2] + [PLANTED] + DISTRACTORS[2:4]
    outcome = loo_rerank(scorer, QUESTION, candidates(texts), RerankSettings(target="gold"),
                         gold="4817")
    assert outcome.ranked[0].text == PLANTED and outcome.ranked[0].scores["rerank:loo"] > 0


@pytest.mark.slow
def test_gro_end_to_end_over_sources_with_explanation(tmp_path):
    write_jsonl(tmp_path / "vault.jsonl", [{"id": "code", "text": PLANTED}, {"id": "lib", "text": DISTRACTORS[4]}])
    write_jsonl(tmp_path / "misc.jsonl", [{"id": f"m{i}", "text": t} for i, t in enumerate(DISTRACTORS[:4])])
    ws = Workspace(Config(workspace=tmp_path / "ws", k=3))
    ws.index(SourceSpec("vault", "jsonl", str(tmp_path / "vault.jsonl")))
    ws.index(SourceSpec("misc", "jsonl", str(tmp_path / "misc.jsonl")))
    result = ws.search(QUESTION, method="gro", retrieval="dense", target="query", n=4)
    assert result.selection is not None and "vault" in result.selection.sources
    assert result.rerank is not None and result.rerank.target == QUESTION
    assert {c.source for c in result.candidates} <= set(result.selection.sources) and "lm_pass" in result.timings
    for candidate in result.candidates:
        assert {"prior", "rerank:gate", "rerank:final"} <= set(candidate.scores)
    dense = ws.search(QUESTION, method="dense", retrieval="dense")
    assert [c.scores["prior"] for c in dense.candidates] == sorted((c.scores["prior"] for c in dense.candidates),
                                                                   reverse=True)
