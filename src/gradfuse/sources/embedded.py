"""The embedded default store: BM25 in tantivy plus dense search over MiniLM vectors.

Why tantivy for BM25: measured here on 50k documents it answers in 0.16 ms p50 and indexes 42k docs/s, against
8 ms / 28k docs/s for SQLite FTS5 and 7.8 ms for bm25s; it is a maintained Rust engine with stemming built in, and
its index is a plain folder that versions cleanly. Dense search is an exact matrix product in numpy for sources
under ANN_MIN_VECTORS (about 4 ms for 50k x 384 here, no approximation error to explain); from there on a faiss
IVF index answers instead, because exact search grows linearly with the source (results/scale: its p50, its
recall against exact search and its build time at 10k to 1M passages).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tantivy

from gradfuse.access import Readers
from gradfuse.candidate import Candidate
from gradfuse.sources.base import TIE_SLACK, SourceStats, rank_by_score, read_manifest, stats_from_manifest
from gradfuse.sources.docstore import DocStore, stored_documents
from gradfuse.sources.readable_bm25 import (
    FIELDS,
    LENGTHS_FILE,
    RESCORE_POOL,
    load_lengths,
    pool_query,
    query_parts,
    readable_idf,
    rescored,
    token_lengths,
)
from gradfuse.ingest.documents import Document
from gradfuse.embedding.encoder import load_encoder
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
    builder.add_text_field("readers", stored=False, tokenizer_name="raw")  # who may read it, OPEN for everyone
    builder.add_text_field("file", stored=False, tokenizer_name="raw")  # a file's passages go when it changes
    return builder.build()


OPEN = "*"  # the readers term of a document that names none (no reader's name can be "*": gradfuse.access)


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


def write_embedded_index(version: Path, documents: list[Document], vectors: np.ndarray) -> None:
    """BM25 index and the embedding matrix for `documents`, whose order defines their row numbers, the source's
    summary (what routing reads), and for a large source the approximate index over that matrix."""
    _write_bm25(version, enumerate(documents))
    if any(d.readers for d in documents):  # only a limited caller's BM25 reads them
        np.save(version / LENGTHS_FILE, token_lengths(documents))
    np.save(version / "embeddings.npy", vectors)
    write_summary(version, vectors)
    if len(vectors) >= ANN_MIN_VECTORS:
        import faiss

        faiss.write_index(build_ann_index(vectors), str(version / ANN_FILE))


def update_embedded_index(previous: Path, version: Path, *, dropped_files: list[str], dropped_rows: list[int],
                          documents: list[Document], vectors: np.ndarray) -> None:
    """`previous`'s index without the passages of `dropped_files` (rows `dropped_rows`) and with `documents`
    appended after its last row, in `version` (whose document store is already changed so). Rows keep their
    numbers; a dropped row stays in the matrix as a hole of zeros (`HOLES_FILE`), which no search returns. A sync
    that only adds links the previous BM25 segments and adds the new passages as a segment of their own; one that
    drops passages writes BM25 again from the store up to REWRITE_BM25_ROWS: tantivy only marks a deleted passage,
    its words and their counts stay in the segment and in every score's statistics until a merge, which tantivy-py
    cannot ask for. Above, the dropped passages are marked deleted, until holes write the source whole."""
    previous_vectors = np.load(previous / "embeddings.npy", mmap_mode="r")
    if dropped_files and len(previous_vectors) + len(documents) <= REWRITE_BM25_ROWS:
        _write_bm25(version, stored_documents(version / "docs.sqlite"))
    else:
        (version / "bm25").mkdir()
        for part in (previous / "bm25").iterdir():  # segments never change once written; tantivy's own state does
            if part.name in ("meta.json", ".managed.json"):
                shutil.copyfile(part, version / "bm25" / part.name)
            elif part.is_file() and not part.name.endswith(".lock"):
                os.link(part, version / "bm25" / part.name)
        _index_documents(tantivy.Index.open(str(version / "bm25")),
                         enumerate(documents, start=len(previous_vectors)), dropped_files=dropped_files)
    matrix = np.concatenate([previous_vectors, vectors.astype(np.float32).reshape(-1, previous_vectors.shape[1])])
    holes = np.union1d(live_holes(previous), np.asarray(dropped_rows, dtype=np.int64))
    matrix[holes] = 0.0  # a dropped passage's vector does not stay behind
    # a synced version's limited callers are scored from its live passages (EmbeddedSource), which needs them
    lengths = np.concatenate([load_lengths(previous, len(previous_vectors), stored_documents(
        previous / "docs.sqlite")), token_lengths(documents)])
    lengths[holes] = 0
    np.save(version / LENGTHS_FILE, lengths)
    np.save(version / "embeddings.npy", matrix)
    if len(holes):
        np.save(version / HOLES_FILE, holes)
    write_summary(version, np.delete(matrix, holes, axis=0))
    if (previous / ANN_FILE).is_file():
        import faiss

        ann = faiss.read_index(str(previous / ANN_FILE))
        ann.remove_ids(np.asarray(dropped_rows, dtype=np.int64))
        if len(vectors):  # a sync that only drops files adds nothing
            ann.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32),
                             np.arange(len(previous_vectors), len(matrix), dtype=np.int64))
        faiss.write_index(ann, str(version / ANN_FILE))


# A sync that drops passages writes BM25 again up to this many rows (about 6 s on two cores: 10,000 MS MARCO
# passages took 1.2 s); above, it marks them deleted, and their words' counts stay in the whole index's statistics
# (never in a limited key's: readable_bm25.py counts live passages) until holes write the source whole.
REWRITE_BM25_ROWS = 50_000
HOLES_FILE = "holes.npy"  # rows of the matrix whose passage was dropped by a sync (indexing/folder_sync.py)


def live_holes(version: Path) -> np.ndarray:
    path = version / HOLES_FILE
    return np.load(path) if path.is_file() else np.zeros(0, dtype=np.int64)


def _write_bm25(version: Path, rows: Iterable[tuple[int, Document]]) -> None:
    (version / "bm25").mkdir()
    _index_documents(tantivy.Index(_schema(), path=str(version / "bm25")), rows)


def _index_documents(index: tantivy.Index, rows: Iterable[tuple[int, Document]], dropped_files: list[str] = ()) -> None:
    writer = index.writer(heap_size=200_000_000, num_threads=1)
    for file in dropped_files:
        writer.delete_documents_by_term("file", file)
    for row, document in rows:
        indexed = tantivy.Document(row=row, title=document.title, body=document.text)
        for reader in document.readers or (OPEN,):
            indexed.add_text("readers", reader)
        if document.parent_id:
            indexed.add_text("file", document.parent_id)
        writer.add_document(indexed)
    writer.commit()
    writer.wait_merging_threads()


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
        live = np.ones(len(self._vectors), dtype=bool)
        live[live_holes(version)] = False
        # Every search of a source with holes reads through the live rows' mask (an exact search would rank a
        # hole's zero vector above passages of negative cosine)
        self._live = None if live.all() else Readable(None, live, int(live.sum()), np.packbits(live, bitorder="little"))
        # Callers limited to some passages are scored from what they may read (readable_bm25.py): where passages
        # name readers, and where a sync dropped some (its BM25 may hold them only marked deleted, from this
        # release or an older one, their counts still in tantivy's statistics)
        limited = self._manifest.get("restricted") or not live.all()
        self._rows = RowReaders(self._docs, live) if limited else None
        self._lengths: np.ndarray | None = None  # read on a limited caller's first BM25 search
        self._lengths_lock = threading.Lock()
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

    def document(self, doc_id: str, *, readers: Readers = None) -> Candidate | None:
        return self._docs.document(self.name, doc_id, readers)

    def search(self, query: str, k: int, *, readers: Readers = None, mode: str | None = None) -> list[Candidate]:
        mode, deeper = mode or self.mode, k + TIE_SLACK
        readable = self._live if readers is None or self._rows is None else self._rows.readable(readers)
        if mode == "hybrid":
            return self._hybrid(query, deeper, k, readable)
        rows, scores = self._bm25(query, deeper, readable) if mode == "bm25" else self._dense(query, deeper, readable)
        return rank_by_score(self._docs.candidates(self.name, rows, scores), k)

    def _bm25(self, query: str, k: int, readable: Readable | None = None) -> tuple[list[int], list[float]]:
        # Free text, never query syntax: punctuation goes, and words are lower-cased (the index's tokenizer does so
        # too) so that AND, OR, NOT and IN are words, not operators that fail the parse or change the query.
        lowered = query.lower()
        terms = _TOKEN.findall(lowered)
        if not terms:
            return [], []
        phrases = [_TOKEN.findall(joined) for joined in _JOINED.findall(lowered)]
        if readable is None or readable.readers is None:
            quoted = [f'"{" ".join(phrase)}"' for phrase in phrases]
            parsed = self._index.parse_query(" ".join(terms + quoted), list(FIELDS))
            hits = self._searcher.search(parsed, k).hits
            return [self._searcher.doc(address)["row"][0] for _, address in hits], [score for score, _ in hits]
        # Only what the caller may read is ranked, and scored from the statistics of what it may read alone
        # (sources/readable_bm25.py). A union of the names' postings, not a term set (a bitset of the whole index
        # each query): 30% faster.
        allowed = tantivy.Query.const_score_query(tantivy.Query.boolean_query([(tantivy.Occur.Should, tantivy.Query.
            term_query(self._index.schema, "readers", name)) for name in (OPEN, *sorted(readable.readers))]), 0.0)
        parts = query_parts(terms, phrases)
        idf = readable_idf(parts, lambda field, word: self._searcher.search(self._within(tantivy.Query.term_query(
            self._index.schema, field, word), allowed), 1, count=True).count, readable.count)
        pool = pool_query(self._index.schema, idf)
        # every readable match up to RESCORE_POOL (then nothing else decides which are scored), else the pool's best
        hits = self._searcher.search(self._within(pool, allowed), max(k, RESCORE_POOL)).hits
        rows = [self._searcher.doc(address)["row"][0] for _, address in hits]
        scores = rescored(self._docs.texts(rows), idf=idf, mean_lengths=self._mean_lengths(readable))
        best = sorted(rows, key=lambda row: (-scores[row], row))[:k]
        return best, [scores[row] for row in best]

    @staticmethod
    def _within(query: tantivy.Query, allowed: tantivy.Query) -> tantivy.Query:
        return tantivy.Query.boolean_query([(tantivy.Occur.Must, query), (tantivy.Occur.Must, allowed)])

    def _mean_lengths(self, readable: Readable) -> np.ndarray:
        """The mean tokens per field of the passages `readable` holds (kept with it: one caller asks again)."""
        if readable.mean_lengths is None:
            with self._lengths_lock:
                if self._lengths is None:
                    self._lengths = load_lengths(self._version, len(self._vectors),
                                                 stored_documents(self._version / "docs.sqlite"))
            readable.mean_lengths = self._lengths[readable.mask].sum(axis=0) / max(1, readable.count)
        return readable.mean_lengths

    def _dense(self, query: str, k: int, readable: Readable | None = None) -> tuple[list[int], list[float]]:
        if len(self._vectors) == 0:
            return [], []
        query_vector = load_encoder(self._manifest["encoder"]).encode_query(query)
        search = self.approximate_search if self._ann is not None else self.exact_search
        return search(query_vector, k, readable)

    def exact_search(self, query_vector: np.ndarray, k: int,
                     readable: Readable | None = None) -> tuple[list[int], list[float]]:
        """(rows, cosines) of the k nearest vectors (among the `readable` rows), by the full matrix product."""
        similarities = self._vectors @ query_vector
        if readable is not None:
            similarities[~readable.mask] = -np.inf
            k = min(k, readable.count)
            if k == 0:
                return [], []
        top = np.argpartition(-similarities, min(k, len(similarities)) - 1)[:k]
        top = top[np.argsort(-similarities[top], kind="stable")]
        return top.tolist(), similarities[top].tolist()

    def approximate_search(self, query_vector: np.ndarray, k: int,
                           readable: Readable | None = None) -> tuple[list[int], list[float]]:
        """(rows, cosines) from the IVF index (a large source's; see ANN_MIN_VECTORS), among the `readable` rows
        only: faiss skips the others while it scans, and where the lists it scans hold fewer than k readable rows,
        every list is scanned, so k come back wherever k are readable."""
        import faiss

        vector = np.asarray(query_vector, dtype=np.float32)[None]
        if readable is None:
            scores, rows = self._ann.search(vector, k)
        else:
            k = min(k, readable.count)
            if k == 0:
                return [], []
            selector = faiss.IDSelectorBitmap(len(readable.mask), faiss.swig_ptr(readable.bitmap))
            for probes in (self._ann.nprobe, self._ann.nlist):
                scores, rows = self._ann.search(vector, k, params=faiss.SearchParametersIVF(sel=selector,
                                                                                           nprobe=probes))
                if (rows[0] >= 0).sum() >= k:
                    break
        found = rows[0] >= 0  # faiss pads with -1 when the scanned lists hold fewer than k
        return rows[0][found].tolist(), scores[0][found].tolist()

    def _hybrid(self, query: str, deeper: int, k: int, readable: Readable | None = None) -> list[Candidate]:
        depth = hybrid_depth(deeper)
        best = rrf_in_source({"bm25": self._bm25(query, depth, readable)[0],
                              "dense": self._dense(query, depth, readable)[0]}, deeper)
        candidates = self._docs.candidates(self.name, [row for row, _, _ in best], [score for _, score, _ in best])
        for candidate, (_, _, ranks) in zip(candidates, best):
            candidate.retrieval_ranks = ranks
        return rank_by_score(candidates, k)

    def stats(self) -> SourceStats:
        return stats_from_manifest(self.name, self._version, self._manifest, self.mode)


@dataclass(eq=False)
class Readable:
    """The rows of a source one caller may read."""

    readers: frozenset[str] | None  # None: every reader (the mask leaves out only a sync's holes)
    mask: np.ndarray  # bool, one per row
    count: int
    bitmap: np.ndarray  # the mask as faiss' IDSelectorBitmap reads it (bit i of byte i // 8, lowest first)
    mean_lengths: np.ndarray | None = None  # tokens per field of these rows on average (readable_bm25.py)


class RowReaders:
    """Which rows each caller may read, for a source whose documents name their readers: read from its document
    store on the first search that needs it (a source nobody restricted never reads it), a mask kept for each of
    the last MASKS callers' readers."""

    MASKS = 64

    def __init__(self, docs: DocStore, live: np.ndarray):
        self._docs, self._live = docs, live
        self._by_readers: dict[tuple[str, ...], np.ndarray] | None = None
        self._masks: OrderedDict[frozenset[str], Readable] = OrderedDict()
        self._lock = threading.Lock()

    def readable(self, readers: frozenset[str]) -> Readable:
        with self._lock:
            if readers in self._masks:
                self._masks.move_to_end(readers)
                return self._masks[readers]
            if self._by_readers is None:
                grouped: dict[tuple[str, ...], list[int]] = {}
                for row, names in self._docs.restricted_rows():
                    grouped.setdefault(names, []).append(row)
                self._by_readers = {names: np.asarray(rows, dtype=np.int64) for names, rows in grouped.items()}
            mask = self._live.copy()
            for names, rows in self._by_readers.items():
                mask[rows] = not readers.isdisjoint(names)
            readable = Readable(readers, mask, int(mask.sum()), np.packbits(mask, bitorder="little"))
            self._masks[readers] = readable
            if len(self._masks) > self.MASKS:
                self._masks.popitem(last=False)
            return readable

