"""The embedded default store: BM25 in tantivy plus dense search over MiniLM vectors.

Why tantivy for BM25: measured here on 50k documents it answers in 0.16 ms p50 and indexes 42k docs/s, against
8 ms / 28k docs/s for SQLite FTS5 and 7.8 ms for bm25s; it is a maintained Rust engine with stemming built in, and
its index is a plain folder that versions cleanly. Dense search is an exact matrix product in numpy for sources
under ANN_MIN_VECTORS (about 4 ms for 50k x 384 here, no approximation error to explain); from there on a faiss
IVF index answers instead, because exact search grows linearly with the source (results/scale: its p50, its
recall against exact search and its build time at 10k to 1M passages).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import tantivy

from gradfuse.candidate import Candidate
from gradfuse.sources.base import TIE_SLACK, SourceStats, rank_by_score, read_manifest, stats_from_manifest
from gradfuse.sources.docstore import DocStore
from gradfuse.sources.documents import Document
from gradfuse.sources.encoder import EmbeddingCache, embedding_text, load_encoder
from gradfuse.sources.summary import write_summary

RETRIEVAL_MODES = ("bm25", "dense", "hybrid")
HYBRID_RRF_K = 60
HYBRID_MIN_DEPTH = 50  # each of a hybrid search's two rankings is at least this deep before they are fused


def hybrid_depth(k: int) -> int:
    return max(k, HYBRID_MIN_DEPTH)


def rrf_in_source(rankings: dict[str, list], k: int) -> list[tuple]:
    """RRF of one source's own named rankings (bm25 and dense) by document key: (key, fused score, its rank in
    each ranking that holds it), best first, equal sums by key. Shared by every store, so `hybrid` means the same
    thing wherever a source lives; the ranks let a federated RRF fuse the lists themselves."""
    fused: dict = {}
    ranks: dict = {}
    for name, ranking in rankings.items():
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (HYBRID_RRF_K + rank)
            ranks.setdefault(key, {})[name] = rank
    best = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
    return [(key, score, ranks[key]) for key, score in best]


_TOKEN = re.compile(r"\w+", flags=re.UNICODE)
# A date, version or file name ("2003-09-19", "1.2.3", "libtasn1.h"): its parts are common alone, so it is also
# asked as a phrase, which scores the passages that hold it whole above those that hold its parts apart.
_JOINED = re.compile(r"\w+(?:[-./:]\w+)+", flags=re.UNICODE)


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("row", stored=True, indexed=False)
    builder.add_text_field("title", stored=False, tokenizer_name="en_stem")
    builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
    return builder.build()


# Exact dense search below this many vectors, an IVF index from it on (see results/scale for where the curves cross).
ANN_MIN_VECTORS = 200_000
ANN_FILE = "embeddings.ivf"


def ann_lists(count: int) -> int:
    """Inverted lists of an IVF index over `count` vectors (about 4 sqrt(n), faiss' usual guidance)."""
    return max(1, int(4 * np.sqrt(count)))


def ann_probes(lists: int) -> int:
    """Lists one query scans: about 3% of them, which kept recall@10 against exact search near 0.95 or above on
    the shared corpora (results/scale)."""
    return max(8, lists // 32)


def build_ann_index(vectors: np.ndarray, *, seed: int = 0):
    """A faiss IVF-Flat index (inner product over normalised vectors = cosine), trained on a seeded sample."""
    import faiss

    lists = ann_lists(len(vectors))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(vectors.shape[1]), vectors.shape[1], lists,
                               faiss.METRIC_INNER_PRODUCT)
    # 40 points a list (faiss warns below 39) and 20 k-means rounds: at 1M vectors training is most of the build.
    sample = np.random.default_rng(seed).choice(len(vectors), min(len(vectors), 40 * lists), replace=False)
    index.cp.seed, index.cp.niter = seed, 20
    index.train(np.ascontiguousarray(vectors[np.sort(sample)], dtype=np.float32))
    for start in range(0, len(vectors), 100_000):  # in slices: the matrix may be a memory map
        index.add(np.ascontiguousarray(vectors[start : start + 100_000], dtype=np.float32))
    index.nprobe = ann_probes(lists)
    return index


def write_embedded_index(version: Path, documents: list[Document], cache: EmbeddingCache, progress: bool) -> int:
    """BM25 index and the embedding matrix for `documents`, whose order defines their row numbers, the source's
    summary (what routing reads), and for a large source the approximate index over that matrix."""
    (version / "bm25").mkdir()
    index = tantivy.Index(_schema(), path=str(version / "bm25"))
    writer = index.writer(heap_size=200_000_000, num_threads=1)
    for row, document in enumerate(documents):
        writer.add_document(tantivy.Document(row=row, title=document.title, body=document.text))
    writer.commit()
    writer.wait_merging_threads()
    vectors = cache.embed([embedding_text(d.title, d.text) for d in documents], progress=progress)
    np.save(version / "embeddings.npy", vectors)
    write_summary(version, vectors)
    if len(vectors) >= ANN_MIN_VECTORS:
        import faiss

        faiss.write_index(build_ann_index(vectors), str(version / ANN_FILE))
    return cache.last_computed


class EmbeddedSource:
    """A built source folder, searchable by BM25, dense cosine, or both fused by in-source RRF."""

    def __init__(self, name: str, version: Path, *, mode: str = "hybrid"):
        if mode not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval mode {mode!r} is not one of {', '.join(RETRIEVAL_MODES)}")
        self.name, self.mode, self._version = name, mode, version
        self._manifest = read_manifest(version)
        self._docs = DocStore(version / "docs.sqlite")
        self._index = tantivy.Index.open(str(version / "bm25"))
        self._searcher = self._index.searcher()
        self._vectors = np.load(version / "embeddings.npy", mmap_mode="r")
        self._ann = None
        if (version / ANN_FILE).is_file():
            import faiss

            self._ann = faiss.read_index(str(version / ANN_FILE))

    def close(self) -> None:
        """Let go of the version's files (a replaced version's are deleted: open, they hold their disk space)."""
        self._docs.close()
        self._searcher = self._index = self._vectors = self._ann = None

    def warm(self) -> None:
        if self.mode != "bm25" and len(self._vectors):
            load_encoder(self._manifest["encoder"])

    def document(self, doc_id: str) -> Candidate | None:
        """One passage by its id (a cited passage opened again), or None."""
        row = self._docs.rows_for_ids([doc_id]).get(doc_id)
        return None if row is None else self._docs.candidates(self.name, [row], [0.0])[0]

    def search(self, query: str, k: int, *, mode: str | None = None) -> list[Candidate]:
        mode, deeper = mode or self.mode, k + TIE_SLACK
        if mode == "hybrid":
            return self._hybrid(query, deeper, k)
        rows, scores = self._bm25(query, deeper) if mode == "bm25" else self._dense(query, deeper)
        return rank_by_score(self._docs.candidates(self.name, rows, scores), k)

    def _bm25(self, query: str, k: int) -> tuple[list[int], list[float]]:
        # Free text, never query syntax: punctuation goes, and words are lower-cased (the index's tokenizer does so
        # too) so that AND, OR, NOT and IN are words, not operators that fail the parse or change the query.
        lowered = query.lower()
        terms = _TOKEN.findall(lowered)
        if not terms:
            return [], []
        phrases = [f'"{" ".join(_TOKEN.findall(joined))}"' for joined in _JOINED.findall(lowered)]
        parsed = self._index.parse_query(" ".join(terms + phrases), ["title", "body"])
        hits = self._searcher.search(parsed, k).hits
        return [self._searcher.doc(address)["row"][0] for _, address in hits], [score for score, _ in hits]

    def _dense(self, query: str, k: int) -> tuple[list[int], list[float]]:
        if len(self._vectors) == 0:
            return [], []
        query_vector = load_encoder(self._manifest["encoder"]).encode_query(query)
        search = self.approximate_search if self._ann is not None else self.exact_search
        return search(query_vector, k)

    def exact_search(self, query_vector: np.ndarray, k: int) -> tuple[list[int], list[float]]:
        """(rows, cosines) of the k nearest vectors, by the full matrix product."""
        similarities = self._vectors @ query_vector
        top = np.argpartition(-similarities, min(k, len(similarities)) - 1)[:k]
        top = top[np.argsort(-similarities[top], kind="stable")]
        return top.tolist(), similarities[top].tolist()

    def approximate_search(self, query_vector: np.ndarray, k: int) -> tuple[list[int], list[float]]:
        """(rows, cosines) from the IVF index (a large source's; see ANN_MIN_VECTORS)."""
        scores, rows = self._ann.search(np.asarray(query_vector, dtype=np.float32)[None], k)
        found = rows[0] >= 0  # faiss pads with -1 when the scanned lists hold fewer than k
        return rows[0][found].tolist(), scores[0][found].tolist()

    def _hybrid(self, query: str, deeper: int, k: int) -> list[Candidate]:
        depth = hybrid_depth(deeper)
        best = rrf_in_source({"bm25": self._bm25(query, depth)[0], "dense": self._dense(query, depth)[0]}, deeper)
        candidates = self._docs.candidates(self.name, [row for row, _, _ in best], [score for _, score, _ in best])
        for candidate, (_, _, ranks) in zip(candidates, best):
            candidate.retrieval_ranks = ranks
        return rank_by_score(candidates, k)

    def stats(self) -> SourceStats:
        return stats_from_manifest(self.name, self._version, self._manifest, self.mode)

