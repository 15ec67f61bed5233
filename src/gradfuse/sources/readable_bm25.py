"""BM25 made only from what one caller may read, for a key limited to some of a source's documents.

tantivy scores BM25 with statistics of its whole index: how many passages hold each word, and their mean length.
A key that reads only `public/` would see its own passages' scores move as files it may not read gain or lose a
word of its choosing, and so count them. For such a key, the passages tantivy finds among those it may read are
scored again here with the same formula (Robertson's BM25, k1 1.2, b 0.75, tantivy's idf, each field on its own, a
phrase weighed by the sum of its words' idf) over the statistics of its readable passages alone: the number of
them that hold each word (counted by tantivy inside the same filter), how many it may read, and their mean
length per field (from the token counts a build keeps, LENGTHS_FILE). Its scores and their order then depend on
nothing it may not read. Which passages enter the rescoring, when more than RESCORE_POOL of its own match, is chosen
by tantivy with each word weighed by its idf among the caller's passages (pool_query): what still enters that choice
from the whole index is tantivy's mean passage length and the rounding of its float scores (passages that tie here
can be cut apart there), never a count of a word.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import tantivy

from gradfuse.ingest.documents import Document

LENGTHS_FILE = "lengths.npy"  # tokens of each row's title and body, as the index counts them (int32, rows x 2)
FIELDS = ("title", "body")
K1, B = 1.2, 0.75  # tantivy's
# Passages rescored at the most (about 70 ms of tokenizing here at the most): every readable match up to it, else
# the best of pool_query's ranking
RESCORE_POOL = 1000

# tantivy's "en_stem": the index's tokenizer, so that words and lengths are counted as the index counts them
ANALYZER = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.stemmer("english")).build())


def token_lengths(documents: Iterable[Document]) -> np.ndarray:
    """(rows, 2): each passage's tokens in its title and its body."""
    lengths = [(len(ANALYZER.analyze(d.title)), len(ANALYZER.analyze(d.text))) for d in documents]
    return np.asarray(lengths, dtype=np.int32).reshape(-1, len(FIELDS))


def query_parts(terms: list[str], phrases: list[list[str]]) -> list[tuple[str, ...]]:
    """The query's words and phrases as the index holds them (stemmed): one tuple each, a word's of one."""
    words = [tuple(ANALYZER.analyze(term)) for term in terms]
    joined = [tuple(token for word in phrase for token in ANALYZER.analyze(word)) for phrase in phrases]
    return [part for part in words + joined if part]


def readable_idf(parts: list[tuple[str, ...]], counts, readable: int) -> dict[tuple[str, tuple[str, ...]], float]:
    """Each (field, part)'s idf among the caller's passages: a phrase's is the sum of its words' (as tantivy's);
    `counts(field, word)`: how many readable passages hold a word in a field; `readable`: how many it may read."""
    return {(field, part): sum(_idf(counts(field, word), readable) for word in part)
            for field in FIELDS for part in set(parts)}


def rescored(parts: list[tuple[str, ...]], texts: dict[int, tuple[str, str]], *, idf: dict,
             mean_lengths: np.ndarray) -> dict[int, float]:
    """Each row's BM25 over the caller's statistics (`idf` from readable_idf, `mean_lengths` per field): `texts`
    (row: (title, body)) are the passages to score."""
    scores = {}
    for row, fields in texts.items():
        score = 0.0
        for index, (field, text) in enumerate(zip(FIELDS, fields)):
            tokens = ANALYZER.analyze(text)
            norm = K1 * (1 - B + B * len(tokens) / max(float(mean_lengths[index]), 1e-9))
            for part in parts:
                frequency = _occurrences(tokens, part)
                if frequency:
                    score += idf[field, part] * frequency * (K1 + 1) / (frequency + norm)
        scores[row] = score
    return scores


def pool_query(schema: tantivy.Schema, parts: list[tuple[str, ...]], idf: dict, whole_idf) -> tantivy.Query:
    """The query that picks the passages to rescore: each part in each field, weighed by its idf among the caller's
    passages (tantivy's own weight, from the whole index, divided out: `whole_idf(field, part)`), so that which
    passages enter the pool does not turn on how many passages the caller may not read hold a word."""
    clauses = []
    for (field, part), weight in idf.items():
        whole = whole_idf(field, part)
        if weight <= 0 or whole <= 0:
            continue
        matched = (tantivy.Query.term_query(schema, field, part[0], index_option="freq") if len(part) == 1
                   else tantivy.Query.phrase_query(schema, field, list(part)))
        clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(matched, weight / whole)))
    return tantivy.Query.boolean_query(clauses) if clauses else tantivy.Query.empty_query()


def whole_index_idf(searcher: tantivy.Searcher, field: str, part: tuple[str, ...]) -> float:
    """A part's idf as tantivy weighs it over the whole index."""
    return sum(_idf(searcher.doc_freq(field, word), searcher.num_docs) for word in part)


def _idf(holding: int, total: int) -> float:
    return math.log(1 + (total - holding + 0.5) / (holding + 0.5))


def _occurrences(tokens: list[str], part: tuple[str, ...]) -> int:
    if len(part) == 1:
        return tokens.count(part[0])
    width = len(part)
    return sum(tuple(tokens[i : i + width]) == part for i in range(len(tokens) - width + 1))


def load_lengths(version: Path, rows: int, documents) -> np.ndarray:
    """The version's token counts; one built before they were kept has them counted now from its store
    (`documents`: its (row, passage) pairs), not written: a published version's files do not change."""
    path = version / LENGTHS_FILE
    if path.is_file():
        return np.load(path)
    lengths = np.zeros((rows, len(FIELDS)), dtype=np.int32)
    for row, document in documents:
        lengths[row] = token_lengths([document])[0]
    return lengths
