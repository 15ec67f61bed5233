"""The pool stage 2 looks at: the chosen sources' candidates, deduplicated and ordered by a prior.

- cosine: the shared encoder's cosine to the query (what `dense` ranks by);
- rrf, combsum-z: the sources' own rankings fused (weighted by the sources' weights), which keeps what strong
  sources already know (on DL19 the runs' fusion is far above MiniLM's cosine).

Every candidate of the pool gets `scores["prior"]`, the pool's score, which the final mix uses.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gradfuse.candidate import Candidate, merge_duplicates
from gradfuse.fusion import fuse


def ordered_pool(ranked_lists: dict[str, list[Candidate]], pool: str, *, query_vector: np.ndarray,
                 embed: Callable[[list[Candidate]], np.ndarray], weights: dict[str, float] | None = None,
                 ) -> list[Candidate]:
    if pool != "cosine":
        fused = fuse(pool, ranked_lists, weights=weights)
        for candidate in fused:
            candidate.scores["prior"] = candidate.scores[f"fusion:{pool}"]
        return fused
    primaries, _ = merge_duplicates(ranked_lists)
    candidates = list(primaries.values())
    if not candidates:
        return []
    for candidate, prior in zip(candidates, embed(candidates) @ query_vector):
        candidate.scores["prior"] = float(prior)
    return sorted(candidates, key=lambda c: (-c.scores["prior"], c.native_rank, c.key))
