"""The one record that flows through the whole pipeline: sources → fusion → rerank → generation."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class Location:
    """Where a passage stands in the file it was read from, in the terms a person checks it by: the page of a
    PDF, the slide of a deck, the sheet and rows of a spreadsheet, and the headings it sits under."""

    file: str  # the file's path inside the indexed folder
    page: int | None = None  # 1-based
    slide: int | None = None  # 1-based
    sheet: str | None = None
    rows: tuple[int, int] | None = None  # the spreadsheet's own row numbers, first and last (its header repeated)
    headings: tuple[str, ...] = ()  # the section path, outermost first

    def describe(self) -> str:
        """As a citation shows it: "report.pdf · p. 12 · 3.2 Results"."""
        parts = [self.file]
        if self.page is not None:
            parts.append(f"p. {self.page}")
        if self.slide is not None:
            parts.append(f"slide {self.slide}")
        if self.sheet is not None:
            rows = "" if not self.rows else (f", row {self.rows[0]}" if self.rows[0] == self.rows[1]
                                              else f", rows {self.rows[0]}–{self.rows[1]}")
            parts.append(f"sheet {self.sheet}{rows}")
        if self.headings:
            parts.append(" › ".join(self.headings))
        return " · ".join(parts)

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in (None, ())})

    @classmethod
    def from_json(cls, text: str | None) -> Location | None:
        return cls.from_dict(json.loads(text)) if text else None

    @classmethod
    def from_dict(cls, values: dict) -> Location:
        """From its JSON form: lists become the tuples they were, and null fields keep their defaults' meaning."""
        return cls(**{name: tuple(value) if name in ("rows", "headings") and value is not None else value
                      for name, value in values.items()})


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
    location: Location | None = None  # page, slide, sheet and rows, headings: for passages read from files
    # The text's length at its source, where it was longer than `[guard] max_passage_chars` and was cut to that.
    cut_from: int | None = None
    # Its rank in each of the rankings its source fused into `native_rank` (hybrid: {"bm25": r, "dense": r'}; a
    # ranking that missed it is absent); empty where the source ranks once. Federated RRF fuses these lists.
    retrieval_ranks: dict[str, int] = field(default_factory=dict)
    # How an engine's `native_score` was made, higher always better: "cosine", "ip", "-l2" (a distance negated),
    # "bm25", "rrf", "1/rank"; "" where the source is gradfuse's own (its retrieval's score).
    score_kind: str = ""
    metadata: dict[str, object] = field(default_factory=dict)  # an engine's fields named by `metadata_fields`
    # Who may read it, as its store holds it (gradfuse.access); empty: whoever may read its source. Checked again
    # after every search, and never sent to a client (it names the other readers).
    readers: tuple[str, ...] = ()
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
