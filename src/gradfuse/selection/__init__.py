"""Stage 1: which sources answer this query, chosen for relevance and against redundancy.

Every source's candidates are embedded with the one shared encoder, which makes sources comparable:

- relevance rel(q, s): the mean of the `top` best query-document cosines among s's candidates;
- redundancy red(s, s'): how much s's candidates repeat those of s', averaged over both directions so that it is
  symmetric. `similarity` (the method's): the mean over d in D_s of the best cosine to D_s'. `copies`: the mean
  over d of how far that best cosine stands above COPY_FLOOR, scaled to [0, 1]: a passage of the same topic is no
  copy. Where sources overlap (bench/overlap.py), `similarity` gave two disjoint halves of one collection 0.37 to
  0.58, nearly a mirror's 0.72 to 0.88, so a weight that dropped the mirror dropped the half holding a question's
  second passage; `copies` gives the halves 0.00 and copies 0.2 (a digest's samples) to 0.99.

The chosen set S maximises F(S) = sum_{s in S} rel(q, s) - lambda * sum_{s < s' in S} red(s, s'). F is a modular
term minus a pairwise penalty with non-negative weights, hence submodular: the marginal gain of a source can only
shrink as S grows, so adding, one at a time, the source with the largest marginal gain is the right algorithm
(the classic greedy for submodular maximisation, as in maximal marginal relevance). It stops when the best gain
falls below `threshold` or `max_sources` are chosen; the best source is always kept so every query is answered.

Its cost is linear in the number of sources: the greedy reads only the redundancy of each source with those
already chosen (at most `max_sources`), and none at all when lambda is 0. Up to ALL_PAIRS_UP_TO sources every pair
is computed anyway, so that tuning can replay the decision for another lambda without the vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gradfuse.checked import FILE_SETTINGS, Count, Number, Text, Weight


SELECT_FUSIONS = ("rrf", "combsum-z", "concat", "dense")
REDUNDANCY_MEASURES = ("similarity", "copies")
CHOICES = ("hard", "soft")
ALL_PAIRS_UP_TO = 16
# Above this cosine one passage repeats another (bench/overlap.py's sources, 15 dev questions a collection): two
# disjoint halves of one collection scored 0.002 to 0.004 by `copies`, a mirror 0.58 to 0.60, the same text cut
# otherwise 0.25 to 0.93, an edited version 0.75 to 0.99, a digest of samples 0.21 to 0.25.
COPY_FLOOR = 0.8


@dataclass(frozen=True)
class SelectionSettings:
    __pydantic_config__ = FILE_SETTINGS
    # Chosen by grid search on the dev queries of benchmarks/federated.toml (192 queries from 8 folders, disjoint
    # from its test queries; results/federated/results.json, tuned.selection, lists every grid point's dev nDCG@10):
    # lambda 0, threshold 0.3, at most 3 sources, the chosen sources ranked by encoder cosine scored 0.571; the best
    # point with RRF over the chosen sources 0.505 (threshold 0.5, 2 sources), with lambda > 0 0.570. Those sources
    # are disjoint collections, so redundancy rarely matters there: raise lambda for mirrored sources.
    # lambda, with redundancy measured as copies: where sources copy each other (bench/overlap.py, every kind of copy
    # at once) complete evidence@5 rose from 0.372 to 0.417 at lambda 1, the dev choice; on the federated, QA, DL19
    # and answer benchmarks nothing moved by more than 0.0006 (results/overlap/default.md). Measured as similarity
    # (the method's), every lambda > 0 lost on dev: it takes a source on the same topic for a copy.
    redundancy_weight: Weight = 1.0
    redundancy: Text = "copies"  # how red(s, s') is measured: copies | similarity (see the module's docstring)
    threshold: Number = 0.3  # minimum marginal gain to add a source after the first
    max_sources: Count = 3
    top: Count = 3  # documents per source that define its relevance
    candidates: Count = 20  # m: a source's first m candidates stand for it (relevance and redundancy)
    # How `select` ranks the chosen sources' candidates: a fusion method, or "dense" (encoder cosine, the federated
    # dev choice). On multi-hop QA, RRF over the chosen sources pulled the right one down; benchmarks choose on dev.
    fusion: Text = "dense"
    # "hard": the sources chosen above are kept and the others dropped. "soft": every source is ordered by the same
    # greedy gain, none is dropped by threshold or limit, only one whose gain falls more than soft_margin below the
    # best; with select's dense ranking each passage's cosine is lowered by soft_weight times how far its source's
    # gain stands below the best (selection/soft.py), so a weaker source is weighed down, not thrown away. Soft at
    # dev's weight 0.25 and margin 0.2 ranked within 0.0012 nDCG@10 of hard on the federated, QA, DL19 and an
    # ArguAna + SciFact set, none significant (results/stage1/soft.md): hard stays the default. Soft's own defaults
    # are those dev values (bench/soft_selection.py chose them on three sets' dev queries at once).
    choice: Text = "hard"
    soft_weight: Weight = 0.25
    soft_margin: Weight = 0.2  # 2 would drop no source (cosines, hence gains, differ by at most 2)

    def __post_init__(self):
        if self.fusion not in SELECT_FUSIONS:
            raise ValueError(f"unknown fusion {self.fusion!r} for select (choose from {', '.join(SELECT_FUSIONS)})")
        if self.redundancy not in REDUNDANCY_MEASURES:
            raise ValueError(f"unknown redundancy {self.redundancy!r} (choose from {', '.join(REDUNDANCY_MEASURES)})")
        if self.choice not in CHOICES:
            raise ValueError(f"unknown choice {self.choice!r} (choose from {', '.join(CHOICES)})")


@dataclass
class SourceStep:
    source: str
    gain: float  # marginal gain when it was added
    relevance: float
    penalty: float  # lambda * redundancy with the sources chosen before it


@dataclass
class SelectionDecision:
    chosen: list[SourceStep]
    dropped: dict[str, str]  # source → why it was not chosen
    relevance: dict[str, float]
    redundancy: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def sources(self) -> list[str]:
        return [step.source for step in self.chosen]


def source_relevance(query: np.ndarray, documents: np.ndarray, top: int) -> float:
    if len(documents) == 0:
        return float("-inf")
    cosines = np.sort(documents @ query)[::-1]
    return float(cosines[:top].mean())


def source_redundancy(a: np.ndarray, b: np.ndarray, measure: str = "similarity") -> float:
    if len(a) == 0 or len(b) == 0:
        return 0.0
    similarity = a @ b.T
    best = (similarity.max(axis=1), similarity.max(axis=0))
    if measure == "copies":
        best = tuple(np.clip((values - COPY_FLOOR) / (1 - COPY_FLOOR), 0.0, 1.0) for values in best)
    return float((best[0].mean() + best[1].mean()) / 2)


def select_sources(
    query: np.ndarray, documents: dict[str, np.ndarray], settings: SelectionSettings = SelectionSettings()
) -> SelectionDecision:
    """`query` and each source's candidate vectors (in the source's order) are L2-normalised encoder embeddings."""
    documents = {s: vectors[: settings.candidates] for s, vectors in documents.items()}
    names = list(documents)
    relevance = {s: source_relevance(query, documents[s], settings.top) for s in names}
    known: dict[str, dict[str, float]] = {s: {} for s in names}

    def redundancy(s: str, t: str) -> float:
        if t not in known[s]:
            known[s][t] = known[t][s] = source_redundancy(documents[s], documents[t], settings.redundancy)
        return known[s][t]

    if len(names) <= ALL_PAIRS_UP_TO:
        known.update(every_redundancy(documents, settings.redundancy))
    return choose_sources(relevance, redundancy, settings, known)


def every_redundancy(documents: dict[str, np.ndarray], measure: str = "similarity") -> dict[str, dict[str, float]]:
    """red(s, t) for every pair of sources (quadratic: for tuning's replay, which needs them all)."""
    names = list(documents)
    table: dict[str, dict[str, float]] = {s: {} for s in names}
    for i, s in enumerate(names):
        for t in names[i + 1:]:
            table[s][t] = table[t][s] = source_redundancy(documents[s], documents[t], measure)
    return table


def choose_sources(
    relevance: dict[str, float], redundancy: dict[str, dict[str, float]] | Callable[[str, str], float],
    settings: SelectionSettings, known: dict[str, dict[str, float]] | None = None,
) -> SelectionDecision:
    """The greedy maximisation of F(S) on given relevance and redundancy values (a table, or a function of two
    sources whose values it has computed are in `known`); a source without candidates has relevance -inf and is
    never chosen. Split from `select_sources` so tuning can replay it without embeddings."""
    if not callable(redundancy):
        known, table = redundancy, redundancy
        redundancy = lambda s, t: table[s][t]  # noqa: E731
    names = list(relevance)
    decision = SelectionDecision(chosen=[], dropped={}, relevance=relevance, redundancy=known or {})
    remaining = [s for s in names if np.isfinite(relevance[s])]
    decision.dropped.update({s: "returned no candidates" for s in names if not np.isfinite(relevance[s])})
    soft = settings.choice == "soft"
    weight = settings.redundancy_weight
    overlap = dict.fromkeys(remaining, 0.0)  # each source's redundancy with the chosen ones, summed as they come
    while remaining:
        penalties = {s: weight * overlap[s] for s in remaining}
        gains = {s: relevance[s] - penalties[s] for s in remaining}
        best = max(remaining, key=lambda s: (gains[s], s))
        if not soft and len(decision.chosen) >= settings.max_sources:
            decision.dropped.update({s: f"limit of {settings.max_sources} sources reached (gain {gains[s]:.3f})"
                                     for s in remaining})
            break
        if not soft and decision.chosen and gains[best] < settings.threshold:
            for s in remaining:
                why = f"gain {gains[s]:.3f} < threshold {settings.threshold:g}"
                if penalties[s] > 0 and relevance[s] >= settings.threshold:
                    why += f" (relevance {relevance[s]:.3f} minus redundancy penalty {penalties[s]:.3f})"
                decision.dropped[s] = why
            break
        decision.chosen.append(SourceStep(best, gains[best], relevance[best], penalties[best]))
        remaining.remove(best)
        if weight:
            for s in remaining:
                overlap[s] += redundancy(s, best)
    if soft and decision.chosen:
        floor = decision.chosen[0].gain - settings.soft_margin
        decision.dropped.update({step.source: f"gain {step.gain:.3f} more than soft_margin {settings.soft_margin:g} "
                                              f"below the best ({decision.chosen[0].gain:.3f})"
                                 for step in decision.chosen if step.gain < floor})
        decision.chosen = [step for step in decision.chosen if step.gain >= floor]
    return decision
