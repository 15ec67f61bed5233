"""The one record that flows through the whole pipeline: sources → fusion → rerank → generation."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field


@dataclass(slots=True)
class Candidate:
    """A passage as one source returned it, plus every score later stages give it.

    `native_score` and `native_rank` are what the source said and are never overwritten; later stages write
    into `scores` under their own names (``fusion:rrf``, ``rerank:gradient``, ...). When the same text comes
    back from several sources, one copy becomes the primary and the others are kept in `merged`, so no
    provenance is lost.
    """

    source: str
    doc_id: str
    text: str
    native_score: float
    native_rank: int  # 1-based rank inside its source
    title: str = ""
    parent_id: str | None = None  # the original document when this is a chunk of it
    span: tuple[int, int] | None = None  # character offsets of the chunk inside the parent
    scores: dict[str, float] = field(default_factory=dict)
    merged: list[Candidate] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Globally unique id: document ids collide across sources, so they are namespaced."""
        return f"{self.source}/{self.doc_id}"

    @property
    def provenance(self) -> list[tuple[str, str, int]]:
        """(source, doc id, native rank) of this copy and of every duplicate merged into it."""
        return [(c.source, c.doc_id, c.native_rank) for c in (self, *self.merged)]

    @property
    def sources(self) -> list[str]:
        return [c.source for c in (self, *self.merged)]


_SPACES = re.compile(r"\s+")


def content_key(text: str) -> str:
    """Identity of a passage's content: case and whitespace differences do not make a new document."""
    return hashlib.sha1(_SPACES.sub(" ", text).strip().lower().encode()).hexdigest()


def merge_duplicates(
    ranked_lists: dict[str, list[Candidate]],
) -> tuple[dict[str, Candidate], dict[str, dict[str, Candidate]]]:
    """Group copies of the same text across (and within) sources.

    Returns (primaries, per_source): content key → the primary record, and per source content key → that
    source's own best-ranked copy (its native score is what fusion must use). The first source in the given
    order that holds a text owns the primary; every other copy is attached to the primary's `merged` list.
    """
    primaries: dict[str, Candidate] = {}
    per_source: dict[str, dict[str, Candidate]] = {}
    for source, candidates in ranked_lists.items():
        own: dict[str, Candidate] = {}
        for candidate in sorted(candidates, key=lambda c: c.native_rank):
            key = content_key(candidate.text)
            if key in primaries:
                primaries[key].merged.append(candidate)
            else:
                primaries[key] = candidate
            own.setdefault(key, candidate)
        per_source[source] = own
    return primaries, per_source
