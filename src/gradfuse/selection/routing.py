"""Routing: which sources a question is sent to at all, from their summaries (sources/summary.py), before any
source is asked. Stage 1 then chooses among the sources that answered.

Above `[routing] above` sources, a question goes to `budget` of them:

- `summary` (the default): the GRO-RAG selection run on summaries. A source's score is the best cosine to the
  query among its topic centroids and its sampled passages (on the dev queries of bench/many_sources.py this
  found more of the relevant passages' sources than either alone: a centroid stands for a large source, the
  sample is most of a small one); with `redundancy_weight` > 0 the budget is filled greedily, each source's gain
  being its score minus lambda times its redundancy with the closest source already routed (the centroid sets'
  mean best match), so a mirror of a routed source gives way to a source that adds something. Where the
  scores are flat, the budget's cut is arbitrary (sources that each hold every subject score alike): every source
  within `widen_margin` of the best score is asked too, up to `widen_max` sources in all.
- `redde`: the classic sample-based baseline (ReDDE, Si & Callan 2003): the sources' sampled passages form one
  small index; a source's score is how many of the query's top `REDDE_TOP` sampled passages are its own, each
  standing for documents/sample passages of the source.

Every score is one matrix product over all sources' summaries, and the redundancy is computed only against the
sources already routed: the cost grows linearly with the number of sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from gradfuse.checked import FILE_SETTINGS, Count, NonNegative, Seconds, Share, Weight
from gradfuse.selection import source_redundancy
from gradfuse.sources.summary import SummaryTable

ROUTERS = ("summary", "redde")
REDDE_TOP = 100  # sampled passages whose owners are counted (the estimate of where the relevant documents are)


@dataclass(frozen=True)
class RoutingSettings:
    """`[routing]` in gradfuse.toml."""

    __pydantic_config__ = FILE_SETTINGS
    # Route only a question that may reach more sources than this (0: always). At 32 sources asking every one took
    # 150 ms p50, routing to 24 of them 121 ms with the same ranking (results/many_sources/few.md): below that the
    # saving is small, and a source routed away is a risk (at 100 sources split at random routing lost 0.14 nDCG@10).
    above: NonNegative = 32
    # Sources a routed question is sent to: the smallest budget whose dev nDCG@10 came within 0.005 of asking every
    # source at 1,000 sources by topic (results/many_sources: 24; at 100 sources 16 was enough).
    budget: Count = 24
    router: Literal["summary", "redde"] = "summary"
    redundancy_weight: Weight = 0.0
    # Summary router: every source whose score is within this of the best is asked too, up to widen_max in all
    # (0: off). The best summary score stands 0.37-0.46 above the 24th where sources are split by topic, 0.17-0.22
    # where each holds every subject (the median over dev queries, results/many_sources): 0.2 was dev's choice, the
    # smallest margin that ranked as well as the widest in every configuration. At 100 sources split at random it
    # asked 35 instead of 24 (nDCG@10 0.385 -> 0.420, every source 0.514); by topic 24.2-26.5, nothing changed.
    widen_margin: Weight = 0.2
    widen_max: Count = 50
    # Of the budget, this share (a place at least, from a budget of two) goes to sources that cannot be judged (no
    # summary yet, or one that cannot be read: a remote that is down, a key that does not read all of it), and
    # whatever the scored sources leave; the others wait their turn, in rotation. Without it, such sources took
    # the whole budget ahead of every scored one.
    unscored_share: Share = 0.25
    refresh_s: Seconds = 3600.0  # an engine's or a remote's summary is made again when older (federation/summaries.py)
    # ... and its change marker (a count, a version, PostgreSQL's row statistics) read this often: made again at
    # once when it moved
    check_s: Seconds = 30.0
    # Sources held open at once (each holds files, a database connection or a client): the least recently used
    # beyond it is closed, and opened again when next asked (at 1,000 sources by topic, routed to 24: 62 ms p50
    # with all open, 119 ms with 128; results/many_sources). "auto": a quarter of the open-file limit, at most 1,024.
    max_open: Count | Literal["auto"] = "auto"


@dataclass
class RoutingDecision:
    router: str
    asked: list[str]  # the sources the question was sent to: the unscored first, then in the catalog's order
    scores: dict[str, float]  # every scored source's routing score
    budget: int
    unscored: dict[str, str] = field(default_factory=dict)  # asked without a score (no summary yet): why
    reasons: dict[str, str] = field(default_factory=dict)  # a skipped source's reason where it is not its score
    breaker_open: list[str] = field(default_factory=list)  # not asked: their breakers are open
    widened: int = 0  # scored sources asked beyond the budget: within [routing] widen_margin of the best score

    @property
    def skipped(self) -> dict[str, str]:
        """Every source not asked, best-scored first, and why (built when read: at 1,000 sources, 976 lines)."""
        asked = set(self.asked)
        scored = [self.scores[s] for s in self.asked if s in self.scores]
        lowest = min(scored) if scored else float("nan")
        best_first = sorted(self.scores.items(), key=lambda item: -item[1])
        below = f"lowest asked {lowest:.3f}" if scored else f"the {len(self.unscored)} unjudged ones fill it"
        skipped = {s: self.reasons.get(s) or f"routed out by {self.router}: score {score:.3f}, not among the "
                                              f"{len(self.asked)} asked ({below})"
                   for s, score in best_first if s not in asked}
        return skipped | {s: why for s, why in self.reasons.items() if s not in self.scores and s not in asked}


def route(query: np.ndarray, table: SummaryTable, settings: RoutingSettings,
          unscored: dict[str, str] | None = None, empty: list[str] = (), *,
          unavailable: dict[str, str] | None = None, turn: int = 0) -> RoutingDecision:
    """The sources `query` (an L2-normalised encoder vector) is sent to: `unscored` ones (they cannot be judged)
    within their share of the budget, the `turn`-th in rotation first, then the best-scored of `table` up to the
    budget; `empty` ones never, nor `unavailable` ones (an open breaker: each with why)."""
    unavailable = dict(unavailable or {})
    waiting = [n for n in (unscored or {}) if n not in unavailable]
    scored = sum(name not in unavailable for name in table.names)
    # their share (a place at least, from a budget of two), and whatever the scored sources leave unused
    share = max(int(settings.budget * settings.unscored_share), int(settings.budget >= 2))
    places = min(len(waiting), settings.budget, max(share, settings.budget - scored))
    start = turn % len(waiting) if waiting else 0
    rotated = waiting[start:] + waiting[:start]
    asked_unscored = {n: unscored[n] for n in rotated[:places]}
    scores = (_redde_scores if settings.router == "redde" else _summary_scores)(query, table)
    decision = RoutingDecision(settings.router, [], dict(zip(table.names, scores.tolist())), settings.budget,
                               asked_unscored, dict(unavailable), list(unavailable))
    for name in rotated[places:]:
        decision.reasons[name] = (f"not judged ({unscored[name]}) and the {places} places of the budget for "
                                  "unjudged sources ([routing] unscored_share) were taken: asked in turn")
    for name in empty:
        decision.scores[name], decision.reasons[name] = float("-inf"), "holds no passages"
    open_ = np.array([name in unavailable for name in table.names], dtype=bool)
    scores = np.where(open_, -np.inf, scores)
    available = int((~open_).sum())
    room = max(0, min(settings.budget - places, available))
    if settings.widen_margin > 0 and settings.router == "summary" and available:
        flat = int((scores >= scores.max() - settings.widen_margin).sum())
        decision.widened = max(0, min(flat, settings.widen_max - places, available) - room)
        room += decision.widened
    if settings.redundancy_weight > 0 and settings.router == "summary":
        chosen = _greedy(scores, table, settings.redundancy_weight, room, decision.reasons)
    else:
        chosen = _best(scores, room)
    picked = set(asked_unscored) | {table.names[i] for i in chosen}
    decision.asked = [n for n in list(asked_unscored) + table.names if n in picked]
    return decision


def _best(scores: np.ndarray, count: int) -> list[int]:
    """Indexes of the `count` highest scores (ties by position, so a decision is the same every time)."""
    if count <= 0 or len(scores) == 0:
        return []
    order = np.lexsort((np.arange(len(scores)), -scores))
    return order[:count].tolist()


def _summary_scores(query: np.ndarray, table: SummaryTable) -> np.ndarray:
    if not table.names:
        return np.zeros(0)
    query = query.astype(np.float32)
    centroids = np.maximum.reduceat(table.centroids @ query, table.centroid_starts)
    sampled = np.maximum.reduceat(table.sample @ query, table.sample_starts)
    return np.maximum(centroids, sampled).astype(np.float64)


def _redde_scores(query: np.ndarray, table: SummaryTable) -> np.ndarray:
    if not table.names:
        return np.zeros(0)
    cosines = table.sample @ query.astype(np.float32)
    owners = np.repeat(np.arange(len(table.names)), np.diff(np.append(table.sample_starts, len(table.sample))))
    top = np.argsort(-cosines, kind="stable")[:REDDE_TOP]
    sampled = np.bincount(owners, minlength=len(table.names)).astype(np.float64)
    counts = np.bincount(owners[top], minlength=len(table.names)).astype(np.float64)
    estimate = counts * table.documents / np.maximum(sampled, 1)
    # Sources with no sampled passage in the top are ordered by their best sampled cosine, below every counted one.
    best = np.maximum.reduceat(cosines, table.sample_starts).astype(np.float64)
    return np.where(estimate > 0, estimate + 2.0, best)


def _greedy(scores: np.ndarray, table: SummaryTable, weight: float, count: int, reasons: dict[str, str]) -> list[int]:
    """Fill the budget by gain = score - weight * (redundancy with the closest routed source), among the 3 x budget
    best-scored sources: a penalty only lowers a gain, and this bounds the work by the budget, not the sources."""
    shortlist = _best(scores, 3 * count)
    closest = dict.fromkeys(shortlist, 0.0)
    closest_to: dict[int, int] = {}
    chosen: list[int] = []
    while shortlist and len(chosen) < count:
        gains = {i: scores[i] - weight * closest[i] for i in shortlist}
        best = max(shortlist, key=lambda i: (gains[i], -i))
        chosen.append(best)
        shortlist.remove(best)
        rows = table.centroid_rows(best)
        for i in shortlist:
            redundancy = source_redundancy(table.centroid_rows(i), rows)
            if redundancy > closest[i]:
                closest[i], closest_to[i] = redundancy, best
    for i in shortlist:
        if i in closest_to and scores[i] >= min(scores[j] for j in chosen):
            reasons[table.names[i]] = (f"routed out: score {scores[i]:.3f} minus redundancy penalty "
                                       f"{weight * closest[i]:.3f} (with {table.names[closest_to[i]]})")
    return chosen
