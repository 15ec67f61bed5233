"""Uniform fusion baselines: every source's list merged by one rule for every query.

These are what the per-query method has to beat, so their arithmetic is ranx's (CombMAX for concatenation,
CombSUM/CombMNZ with min-max or z-score normalisation, RRF), written here in numpy and checked against ranx's by
the tests: ranx compiles its numba kernels on first use (30 s on two cores), which a request must not wait for.
RRF takes weights here, which ranx's does not.

RRF fuses the rankings the sources made, not only their final lists: a hybrid source's BM25 and dense rankings
are two lists (`Candidate.retrieval_ranks`), as LlamaIndex's and Haystack's fusion of separate retrievers has it.
Fused as one list each, every source's first hit scored 1/61 and they tied across sources. Ties that remain
(every BM25-only source's first hit still scores 1/61) are broken by how far a candidate's native score stands
above the rest of its own list (its z-score there), never by the sources' names.
"""

from __future__ import annotations

import numpy as np

from gradfuse.candidate import Candidate, merge_duplicates

RRF_K = 60

# name → (normalisation, combination, as ranx names them); None marks RRF, which reads ranks, not scores.
_SCORE_METHODS: dict[str, tuple[str | None, str] | None] = {
    "concat": (None, "max"),  # raw native scores; a text found twice keeps its best score
    "rrf": None,
    "combsum": ("min-max", "wsum"),
    "combsum-z": ("zmuv", "wsum"),
    "combmnz": ("min-max", "wmnz"),
    "combmnz-z": ("zmuv", "wmnz"),
}
FUSION_METHODS: tuple[str, ...] = (*_SCORE_METHODS, "single:<source>")


class UnknownMethod(ValueError):
    """`str()` names the method given (the CLI's user typed it); `public` does not, for the server: a client's
    input echoed back through a value-based secret mask tells it which guess is the secret."""

    def __init__(self, message: str, public: str):
        super().__init__(message)
        self.public = public


def check_fusion(method: str, sources: list[str]) -> None:
    """Raise UnknownMethod with the valid choices when `method` cannot run over `sources`."""
    if method.startswith("single:"):
        if method.removeprefix("single:") not in sources:
            listing = f"(sources: {', '.join(sources)})"
            raise UnknownMethod(f"{method!r}: no source named {method.removeprefix('single:')!r} {listing}",
                                f"method: single:<source> names no source of this request {listing}")
    elif method not in _SCORE_METHODS:
        choices = f"(choose from {', '.join(FUSION_METHODS)})"
        raise UnknownMethod(f"unknown fusion method {method!r} {choices}", f"method: unknown fusion method {choices}")


def fuse(
    method: str,
    ranked_lists: dict[str, list[Candidate]],
    *,
    weights: dict[str, float] | None = None,
) -> list[Candidate]:
    """One fused ranking; each candidate gets `scores['fusion:<method>']`, duplicates merged with provenance.

    `weights` (per source, default 1) apply to rrf, combsum (weighted sum) and combmnz (Wu & Crestani's weighting,
    as ranx's wmnz: sum of scores times sum of the weights of the sources that returned the document).
    """
    if method.startswith("single:"):
        # The source may have failed for this query; its failure is reported by the caller, the list is empty.
        only = method.removeprefix("single:")
        ranked_lists = {only: ranked_lists.get(only, [])}
    else:
        check_fusion(method, list(ranked_lists))
    primaries, per_source = merge_duplicates(ranked_lists)
    per_source = {s: own for s, own in per_source.items() if own}
    weights = {s: (weights or {}).get(s, 1.0) for s in per_source}
    if not per_source:
        return []
    standing = {}
    if method == "rrf":
        fused, standing = _weighted_rrf(per_source, weights), _standing(per_source)
    elif method.startswith("single:"):
        fused = {key: c.native_score for key, c in next(iter(per_source.values())).items()}
    else:
        fused = _score_fuse(method, per_source, weights)
    name = f"fusion:{method}"
    result = []
    # Ties (common in rank fusion) break by how far the candidate stands out in its own list (RRF), then by rank
    # in the source, then by key, so output is deterministic.
    for key in sorted(fused, key=lambda key: (-fused[key], -standing.get(key, 0.0), primaries[key].native_rank,
                                              primaries[key].key)):
        primaries[key].scores[name] = fused[key]
        result.append(primaries[key])
    return result


def _weighted_rrf(per_source: dict[str, dict[str, Candidate]], weights: dict[str, float]) -> dict[str, float]:
    """Sum over every ranking that holds the candidate, each a list of its own: a hybrid source's BM25 and dense
    rankings, or a source's single ranking."""
    fused: dict[str, float] = {}
    for source, own in per_source.items():
        for key, candidate in own.items():
            ranks = candidate.retrieval_ranks.values() or (candidate.native_rank,)
            fused[key] = fused.get(key, 0.0) + weights[source] * sum(1.0 / (RRF_K + rank) for rank in ranks)
    return fused


def _standing(per_source: dict[str, dict[str, Candidate]]) -> dict[str, float]:
    """Each candidate's native score as a z-score within its own source's list (its best over the sources that
    returned it): how clearly its source preferred it, comparable across sources whose raw scores are not."""
    standing: dict[str, float] = {}
    for own in per_source.values():
        scores = np.array([c.native_score for c in own.values()], dtype=float)
        spread = scores.std()
        for key, score in zip(own, scores):
            z = float((score - scores.mean()) / spread) if spread > 0 else 0.0
            standing[key] = max(standing.get(key, z), z)
    return standing


def _score_fuse(
    method: str, per_source: dict[str, dict[str, Candidate]], weights: dict[str, float]
) -> dict[str, float]:
    norm, combination = _SCORE_METHODS[method]
    totals: dict[str, float] = {}
    weight_sums: dict[str, float] = {}
    for source, own in per_source.items():
        scores = _normalised(np.array([c.native_score for c in own.values()], dtype=float), norm)
        for key, score in zip(own, scores):
            if combination == "max":
                totals[key] = max(totals.get(key, score), score)
            else:
                totals[key] = totals.get(key, 0.0) + (weights[source] if combination == "wsum" else 1.0) * score
            weight_sums[key] = weight_sums.get(key, 0.0) + weights[source]
    if combination == "wmnz":
        return {key: total * weight_sums[key] for key, total in totals.items()}
    return {key: float(total) for key, total in totals.items()}


def _normalised(scores: np.ndarray, norm: str | None) -> np.ndarray:
    """ranx's per-query normalisations, with its floor on the denominator (a list of equal scores maps to 0)."""
    if norm == "min-max":
        return (scores - scores.min()) / max(scores.max() - scores.min(), 1e-9)
    if norm == "zmuv":
        return (scores - scores.mean()) / max(scores.std(), 1e-9)
    return scores
