"""Soft selection: a source weighed by its stage-1 gain instead of kept or dropped (`[selection] choice = "soft"`).

Each passage of the pool keeps its cosine to the query (`scores["cosine"]`) and gets `scores["source_gain"]`, how
far the best gain among the sources holding it stands below the best source's (0 for the best, negative below);
its pool score (`scores["prior"]`) becomes cosine + soft_weight * source_gain. Weight 0 is dense ranking over every
kept source; a large weight ranks source by source.
"""

from __future__ import annotations

from gradfuse.candidate import Candidate


def weigh_by_source(pool: list[Candidate], gains: dict[str, float], weight: float) -> list[Candidate]:
    """`pool` (each candidate with its cosine as `scores["prior"]`) re-ordered by cosine + weight * source gain;
    `gains`: each kept source's marginal gain, as stage 1 ordered them."""
    if not pool or not gains:
        return pool
    best = max(gains.values())
    for candidate in pool:
        holders = [candidate.source, *(copy.source for copy in candidate.merged)]
        gain = max(gains.get(source, float("-inf")) for source in holders) - best
        candidate.scores["cosine"] = candidate.scores["prior"]
        candidate.scores["source_gain"] = gain
        candidate.scores["prior"] = candidate.scores["cosine"] + weight * gain
    return sorted(pool, key=lambda c: (-c.scores["prior"], c.native_rank, c.key))
