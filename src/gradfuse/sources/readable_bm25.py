"""BM25 made only from what one caller may read, for a key limited to some of a source's documents.

tantivy scores BM25 with statistics of its whole index: how many passages hold each word, and their mean length.
A key that reads only `public/` would see its own passages' scores move as files it may not read gain or lose a
word of its choosing, and so count them. For such a key, the passages tantivy finds among those it may read are
scored again here with the same formula (Robertson's BM25, k1 1.2, b 0.75, tantivy's idf, each field on its own, a
phrase weighed by the sum of its words' idf) over the statistics of its readable passages alone: the number of
them that hold each word (counted by tantivy inside the same filter), how many it may read, and their mean
length per field (from the token counts a build keeps, LENGTHS_FILE). Its scores and their order then depend on
nothing it may not read. When more than RESCORE_POOL of its own passages match, the ones rescored are those holding
the query's rarest words among its own passages (pool_query: a constant per word, nothing of tantivy's statistics);
among passages that tie there, tantivy's order of its documents decides.
"""

from __future__ import annotations

import math
from collections import Counter
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
MAX_PARTS = 64  # distinct words and phrases of a query scored at the most: the rarest among the caller's passages
MAX_ASKED = 1024  # distinct words and phrases counted at the most (two count searches each, ~10 µs)

# tantivy's "en_stem": the index's tokenizer, so that words and lengths are counted as the index counts them
ANALYZER = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.stemmer("english")).build())


def token_lengths(documents: Iterable[Document]) -> np.ndarray:
    """(rows, 2): each passage's tokens in its title and its body."""
    lengths = [(len(ANALYZER.analyze(d.title)), len(ANALYZER.analyze(d.text))) for d in documents]
    return np.asarray(lengths, dtype=np.int32).reshape(-1, len(FIELDS))


def query_parts(terms: list[str], phrases: list[list[str]]) -> list[tuple[str, ...]]:
    """The query's distinct words and phrases as the index holds them (stemmed; a word's tuple of one), a repeated
    one once (as tantivy's query parser counts it), at most MAX_ASKED of them."""
    words = [tuple(ANALYZER.analyze(term)) for term in terms]
    joined = [tuple(token for word in phrase for token in ANALYZER.analyze(word)) for phrase in phrases]
    return list(dict.fromkeys(part for part in words + joined if part))[:MAX_ASKED]


def readable_idf(parts: list[tuple[str, ...]], counts, readable: int) -> dict[tuple[str, tuple[str, ...]], float]:
    """Each (field, part)'s idf among the caller's passages, for the MAX_PARTS parts rarest there (a pasted page is
    scored by its telling words, not its commonest): a phrase's is the sum of its words' (as tantivy's);
    `counts(field, word)`: how many readable passages hold a word in a field; `readable`: how many it may read."""
    holding = {(field, word): counts(field, word) for field in FIELDS for part in parts for word in part}
    idf = {(field, part): sum(_idf(holding[field, word], readable) for word in part)
           for field in FIELDS for part in parts}
    kept = set(sorted(parts, key=lambda part: -max(idf[field, part] for field in FIELDS))[:MAX_PARTS])
    return {key: value for key, value in idf.items() if key[1] in kept}


def rescored(texts: dict[int, tuple[str, str]], *, idf: dict, mean_lengths: np.ndarray) -> dict[int, float]:
    """Each row's BM25 over the caller's statistics (`idf` from readable_idf: the parts scored, `mean_lengths` per
    field): `texts` (row: (title, body)) are the passages."""
    parts = sorted({part for _, part in idf})
    phrases = [part for part in parts if len(part) > 1]
    scores = {}
    for row, fields in texts.items():
        score = 0.0
        for index, (field, text) in enumerate(zip(FIELDS, fields)):
            tokens = ANALYZER.analyze(text)
            counted = Counter(tokens)
            found = {part: counted[part[0]] for part in parts if len(part) == 1 and part[0] in counted}
            found.update({part: n for part in phrases if (n := _occurrences(tokens, part))})
            norm = K1 * (1 - B + B * len(tokens) / max(float(mean_lengths[index]), 1e-9))
            score += sum(idf[field, part] * frequency * (K1 + 1) / (frequency + norm)
                         for part, frequency in found.items())
        scores[row] = score
    return scores


def pool_query(schema: tantivy.Schema, idf: dict) -> tantivy.Query:
    """The query that picks the passages to rescore where more match than RESCORE_POOL: each part in each field
    worth its idf among the caller's passages, whatever tantivy's statistics say (a constant score a clause), so
    that which passages enter the pool turns on nothing the caller may not read."""
    clauses = []
    for (field, part), weight in idf.items():
        if weight > 0:
            matched = (tantivy.Query.term_query(schema, field, part[0]) if len(part) == 1
                       else tantivy.Query.phrase_query(schema, field, list(part)))
            clauses.append((tantivy.Occur.Should, tantivy.Query.const_score_query(matched, weight)))
    return tantivy.Query.boolean_query(clauses) if clauses else tantivy.Query.empty_query()


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
