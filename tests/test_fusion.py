"""Fusion formulas against values computed by hand, and duplicate merging that keeps provenance."""

import pytest
from ranx import Run
from ranx import fuse as ranx_fuse

from gradfuse.candidate import Candidate
from gradfuse.fusion import UnknownMethod, fuse


def ranked(source, *docs):
    """Candidates (doc id, text, score) in rank order."""
    return [Candidate(source, d, text, score, rank) for rank, (d, text, score) in enumerate(docs, start=1)]


def lists():
    # Source a: x=4, y=2, z=0.   Source b: y=10, w=6.   "y" has the same text in both sources.
    return {
        "a": ranked("a", ("x", "text x", 4.0), ("y", "text y", 2.0), ("z", "text z", 0.0)),
        "b": ranked("b", ("y2", "Text  y", 10.0), ("w", "text w", 6.0)),
    }


def scores(fused, method):
    return {c.doc_id: pytest.approx(c.scores[f"fusion:{method}"]) for c in fused}


def test_concat_orders_by_native_score_and_keeps_the_best_score_of_a_duplicate():
    fused = fuse("concat", lists())
    assert [c.doc_id for c in fused] == ["y", "w", "x", "z"]
    assert scores(fused, "concat") == {"y": 10.0, "w": 6.0, "x": 4.0, "z": 0.0}


def test_rrf_by_hand_and_weighted():
    fused = fuse("rrf", lists())
    assert scores(fused, "rrf") == {"y": 1 / 62 + 1 / 61, "x": 1 / 61, "w": 1 / 62, "z": 1 / 63}
    assert fused[0].doc_id == "y"
    weighted = fuse("rrf", lists(), weights={"a": 1.0, "b": 3.0})
    assert scores(weighted, "rrf") == {"y": 1 / 62 + 3 / 61, "x": 1 / 61, "w": 3 / 62, "z": 1 / 63}


def test_rrf_matches_ranx_when_weights_are_equal():
    fused = fuse("rrf", lists())
    keys = {c.doc_id: c for c in fused}
    run_a = Run({"q": {"x": 4.0, "y": 2.0, "z": 0.0}})
    run_b = Run({"q": {"y": 10.0, "w": 6.0}})
    reference = ranx_fuse([run_a, run_b], norm=None, method="rrf").to_dict()["q"]
    assert {d: keys[d].scores["fusion:rrf"] for d in reference} == pytest.approx(reference)


@pytest.mark.parametrize("method, norm, ranx_method", [
    ("concat", None, "max"), ("combsum", "min-max", "wsum"), ("combsum-z", "zmuv", "wsum"),
    ("combmnz", "min-max", "wmnz"), ("combmnz-z", "zmuv", "wmnz")])
def test_score_fusion_matches_ranx_with_weights(method, norm, ranx_method):
    """The request path fuses in numpy (ranx's numba compiles for 30 s on first use); ranx is the reference."""
    weights = {"a": 0.7, "b": 1.9}
    fused = {c.doc_id: c.scores[f"fusion:{method}"] for c in fuse(method, lists(), weights=weights)}
    runs = [Run({"q": {"x": 4.0, "y": 2.0, "z": 0.0}}), Run({"q": {"y": 10.0, "w": 6.0}})]
    params = {} if ranx_method == "max" else {"weights": [weights["a"], weights["b"]]}
    reference = ranx_fuse(runs, norm=norm, method=ranx_method, params=params).to_dict()["q"]
    assert fused == pytest.approx(reference)


def test_combsum_and_combmnz_with_min_max():
    # min-max: a → x 1, y 0.5, z 0;  b → y 1, w 0.
    assert scores(fuse("combsum", lists()), "combsum") == {"y": 1.5, "x": 1.0, "w": 0.0, "z": 0.0}
    assert scores(fuse("combmnz", lists()), "combmnz") == {"y": 3.0, "x": 1.0, "w": 0.0, "z": 0.0}


def test_combsum_and_combmnz_with_z_scores():
    # a: mean 2, population sd sqrt(8/3) → x +1.2247, y 0, z -1.2247;  b: mean 8, sd 2 → y +1, w -1.
    sd = (8 / 3) ** 0.5
    assert scores(fuse("combsum-z", lists()), "combsum-z") == {"y": 1.0, "x": 2 / sd, "w": -1.0, "z": -2 / sd}
    assert scores(fuse("combmnz-z", lists()), "combmnz-z") == {"y": 2.0, "x": 2 / sd, "w": -1.0, "z": -2 / sd}


def test_weighted_combsum():
    fused = fuse("combsum", lists(), weights={"a": 2.0, "b": 1.0})
    assert scores(fused, "combsum") == {"y": 2 * 0.5 + 1.0, "x": 2.0, "w": 0.0, "z": 0.0}


def test_single_source_is_that_source_alone_in_its_order():
    fused = fuse("single:b", lists())
    assert [(c.source, c.doc_id) for c in fused] == [("b", "y2"), ("b", "w")]
    assert fuse("single:missing", lists()) == []  # a failed source yields nothing; its failure is reported


def test_duplicates_are_merged_with_both_provenances_and_native_values_untouched():
    fused = fuse("rrf", lists())
    y = next(c for c in fused if c.doc_id == "y")
    assert y.provenance == [("a", "y", 2), ("b", "y2", 1)]
    assert (y.native_score, y.native_rank) == (2.0, 2)  # fusion never overwrites what the source said
    assert y.merged[0].native_score == 10.0


def test_unknown_method_names_the_choices():
    with pytest.raises(UnknownMethod, match="choose from concat, rrf"):
        fuse("borda", lists())


@pytest.mark.parametrize("method, expected", [
    ("concat", {"x": 4.0, "y": 2.0, "z": 0.0}),
    ("rrf", {"x": 1 / 61, "y": 1 / 62, "z": 1 / 63}),
    ("combsum", {"x": 1.0, "y": 0.5, "z": 0.0}),
    ("combmnz-z", {"x": 2 / (8 / 3) ** 0.5, "y": 0.0, "z": -2 / (8 / 3) ** 0.5}),
])
def test_every_method_works_when_only_one_source_answered(method, expected):
    assert scores(fuse(method, {"a": lists()["a"]}), method) == expected


def test_rrf_fuses_a_hybrid_sources_bm25_and_dense_rankings_as_lists_of_their_own():
    a = ranked("a", ("x", "text x", 2 / 61))  # first in both of its source's rankings
    a[0].retrieval_ranks = {"bm25": 1, "dense": 1}
    b = ranked("b", ("w", "text w", 1 / 61 + 1 / 90))  # first by BM25, 30th by cosine
    b[0].retrieval_ranks = {"bm25": 1, "dense": 30}
    fused = fuse("rrf", {"b": b, "a": a}, weights={"a": 1.0, "b": 2.0})
    assert scores(fused, "rrf") == {"x": 2 / 61, "w": 2 * (1 / 61 + 1 / 90)}
    assert scores(fuse("rrf", {"b": b, "a": a}), "rrf") == {"x": 2 / 61, "w": 1 / 61 + 1 / 90}


def test_rrf_breaks_a_tie_by_how_far_each_first_hit_stands_above_its_own_list_not_by_source_name():
    # Both first hits score 1/61; "b"'s stands far above the rest of its list, "a"'s barely.
    lists = {"a": ranked("a", ("x", "text x", 10.0), ("x2", "text x2", 9.9), ("x3", "text x3", 9.8)),
             "b": ranked("b", ("w", "text w", 9.0), ("w2", "text w2", 1.0), ("w3", "text w3", 0.5))}
    assert [c.doc_id for c in fuse("rrf", lists)][:2] == ["w", "x"]
