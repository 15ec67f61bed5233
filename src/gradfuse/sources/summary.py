"""A source's summary: what routing reads to decide, before any source is asked, which sources a question goes to.

A summary is a few k-means centroids of the source's passage vectors (its topics, each with its share of the
passages) and a small seeded sample of the vectors themselves (what a ReDDE-style router counts), plus the number of
passages. Built sources write it beside their index when they are built; an engine's or a remote's is made from a
sample read through the engine's own client and kept under the workspace's cache (federation/summaries.py).
A summary is at most 24 vectors (18 KB in float16, as stored); stacked for routing in float32, at most 37 KB a
source.
"""

from __future__ import annotations

import base64
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SUMMARY_FILE = "summary.npz"
CENTROIDS = 8  # topics kept per source, fewer for a small one
SAMPLE = 16  # passage vectors kept per source
SAMPLE_TEXTS = 256  # passages read from an engine to make its summary
# The most passages a summary from another server may claim: ReDDE weighs a source by its size, and a remote that
# lied about it would otherwise be routed every question (and see its text).
MAX_CLAIMED_DOCUMENTS = 10_000_000


@dataclass(frozen=True)
class SourceSummary:
    documents: int  # passages in the source
    centroids: np.ndarray  # (c, d) L2-normalised topic centroids
    shares: np.ndarray  # (c,) the fraction of the source's passages nearest each centroid
    sample: np.ndarray  # (s, d) seeded sample of the source's passage vectors

    def save(self, path: Path) -> None:
        """Written whole or not at all (a temporary file of its own, then renamed)."""
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", suffix=".tmp", delete=False) as handle:
            np.savez(handle, documents=np.array(self.documents), centroids=self.centroids.astype(np.float16),
                     shares=self.shares.astype(np.float32), sample=self.sample.astype(np.float16))
        os.replace(handle.name, path)

    @staticmethod
    def load(path: Path) -> SourceSummary:
        with np.load(path) as stored:
            return SourceSummary(int(stored["documents"]), stored["centroids"], stored["shares"], stored["sample"])

    def wire(self, encoder: str) -> dict:
        """As another gradfuse reads it (GET /sources/NAME/summary): float16 rows in base64."""
        return {"documents": self.documents, "encoder": encoder, "dimension": int(self.centroids.shape[1]),
                "centroids": _b64(self.centroids), "shares": [float(x) for x in self.shares],
                "sample": _b64(self.sample)}

    @staticmethod
    def from_wire(documents: int, dimension: int, centroids: str, shares: list[float], sample: str) -> SourceSummary:
        """The summary another gradfuse sent, its rows made unit length again and its size bounded (a remote's
        scale or claims must not win the routing); ValueError where its parts do not fit together, are more than a
        summary holds, or are not finite."""
        rows, sampled = _rows(centroids, dimension), _rows(sample, dimension)
        if not 0 < len(rows) <= CENTROIDS or len(rows) != len(shares) or not 0 < len(sampled) <= SAMPLE:
            raise ValueError(f"{len(rows)} centroids, {len(shares)} shares and {len(sampled)} sampled vectors "
                             f"(a summary holds 1 to {CENTROIDS} centroids, each with its share, and 1 to {SAMPLE} "
                             "sampled vectors)")
        if not (np.isfinite(rows).all() and np.isfinite(sampled).all() and np.isfinite(shares).all()):
            raise ValueError("values that are not finite numbers")
        return SourceSummary(min(documents, MAX_CLAIMED_DOCUMENTS), _unit(rows), np.asarray(shares, np.float32),
                             _unit(sampled))

    @staticmethod
    def merged(parts: list[SourceSummary], *, seed: int = 0) -> SourceSummary:
        """One summary for a source that is several (a remote's), bounded as one source's is: the CENTROIDS
        centroids of largest share, SAMPLE vectors drawn in proportion to each part's passages, and at most
        MAX_CLAIMED_DOCUMENTS passages. A remote listing thousands of sources weighs in routing as one source: its
        thousands of sampled vectors would otherwise fill ReDDE's top passages and win every question. Empty parts
        (a source emptied there) add nothing; with none but those, the merged summary is empty."""
        parts = [part for part in parts if part.documents and len(part.centroids) and len(part.sample)]
        if not parts:
            return SourceSummary(0, np.zeros((0, 0), np.float32), np.zeros(0, np.float32), np.zeros((0, 0), np.float32))
        documents = np.array([max(0, part.documents) for part in parts], dtype=np.float64)
        weights = documents / documents.sum() if documents.sum() else np.full(len(parts), 1 / len(parts))
        shares = np.concatenate([part.shares * weight for part, weight in zip(parts, weights)])
        centroids = np.concatenate([part.centroids for part in parts])
        keep = np.sort(np.argsort(-shares, kind="stable")[:CENTROIDS])
        rows = np.concatenate([part.sample for part in parts])
        chance = np.concatenate([np.full(len(part.sample), weight / max(1, len(part.sample)))
                                 for part, weight in zip(parts, weights)])
        drawn = min(SAMPLE, int((chance > 0).sum()))
        picked = np.sort(np.random.default_rng(seed).choice(len(rows), drawn, replace=False, p=chance / chance.sum()))
        kept_shares = shares[keep] / max(float(shares[keep].sum()), 1e-12)
        return SourceSummary(int(min(documents.sum(), MAX_CLAIMED_DOCUMENTS)), centroids[keep],
                             kept_shares.astype(np.float32), rows[picked])


def _b64(rows: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<f2").tobytes()).decode()


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float32)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def _rows(text: str, dimension: int) -> np.ndarray:
    flat = np.frombuffer(base64.b64decode(text, validate=True), dtype="<f2")
    if dimension < 1 or len(flat) % dimension:
        raise ValueError(f"{len(flat)} values are not rows of {dimension}")
    return flat.reshape(-1, dimension)


def centroid_count(documents: int) -> int:
    """Topics kept for a source of this many passages: one per 16 passages (a topic of fewer is noise), at most
    CENTROIDS."""
    return max(1, min(CENTROIDS, documents // 16))


def summarize(vectors: np.ndarray, *, documents: int | None = None, seed: int = 0) -> SourceSummary:
    """The summary of a source from its passage vectors (all of them, or a sample standing for `documents`)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    count = len(vectors)
    documents = count if documents is None else documents
    if count == 0:
        empty = np.zeros((0, vectors.shape[1] if vectors.ndim == 2 else 0), np.float32)
        return SourceSummary(documents, empty, np.zeros(0, np.float32), empty)
    rng = np.random.default_rng(seed)
    sample = vectors[np.sort(rng.choice(count, min(count, SAMPLE), replace=False))]
    topics = centroid_count(count)
    if topics == 1:
        centroids = vectors.mean(axis=0, keepdims=True)
        nearest = np.zeros(count, dtype=np.int64)
    else:
        import faiss  # the k-means the IVF index uses too

        kmeans = faiss.Kmeans(vectors.shape[1], topics, niter=10, seed=seed, spherical=True, min_points_per_centroid=1)
        kmeans.train(np.ascontiguousarray(vectors[rng.choice(count, min(count, 4096), replace=False)]))
        centroids = kmeans.centroids
        nearest = np.argmax(vectors @ centroids.T, axis=1)
    centroids = centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    shares = np.bincount(nearest, minlength=len(centroids)).astype(np.float32) / count
    keep = shares > 0
    return SourceSummary(documents, centroids[keep].astype(np.float32), shares[keep], sample)


def write_summary(version: Path, vectors: np.ndarray) -> None:
    summarize(vectors).save(version / SUMMARY_FILE)


def read_summary(version: Path) -> SourceSummary | None:
    """A built version's summary; one built before summaries existed has it made from its vectors (not written:
    a published version's files do not change)."""
    path = version / SUMMARY_FILE
    if path.is_file():
        return SourceSummary.load(path)
    vectors = version / "embeddings.npy"
    return summarize(np.load(vectors, mmap_mode="r")) if vectors.is_file() else None


@dataclass
class SummaryTable:
    """Many sources' summaries stacked, so that one matrix product scores them all. Each source's centroids and
    sample rows are contiguous, in `names` order; every source here has at least one of each."""

    names: list[str]
    documents: np.ndarray  # (n,)
    centroids: np.ndarray  # (C, d) float32
    centroid_starts: np.ndarray  # (n,) where each source's centroids begin
    sample: np.ndarray  # (S, d)
    sample_starts: np.ndarray  # (n,)

    @staticmethod
    def stack(summaries: dict) -> SummaryTable:
        names = list(summaries)
        centroids = [summaries[n].centroids for n in names]
        sample = [summaries[n].sample for n in names]
        return SummaryTable(
            names, np.array([summaries[n].documents for n in names], dtype=np.float64),
            np.concatenate(centroids).astype(np.float32) if names else np.zeros((0, 0), np.float32),
            _starts([len(c) for c in centroids]),
            np.concatenate(sample).astype(np.float32) if names else np.zeros((0, 0), np.float32),
            _starts([len(s) for s in sample]),
        )

    def centroid_rows(self, index: int) -> np.ndarray:
        end = self.centroid_starts[index + 1] if index + 1 < len(self.names) else len(self.centroids)
        return self.centroids[self.centroid_starts[index]:end]


def _starts(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if lengths else np.zeros(0, np.int64)
