"""Sentence evidence: the record of one scored sentence of a passage the generator saw, next to the candidate
record (never extra fields on it), and how passages are cut into sentences.

A sentence is kept by its character span in the passage's text, and so in the parent document where the passage
is a chunk of one: a person can check every quoted sentence against its source.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

from gradfuse.candidate import Candidate, Location
from gradfuse.ingest.readers.tables import row_cells


@dataclass(frozen=True)
class Evidence:
    passage: int  # the passage's number in the prompt, from 1 ([n] in the answer)
    source: str
    doc_id: str
    span: tuple[int, int]  # characters of the passage's text
    text: str
    score: float  # the evidence scorer's value (higher is more needed), comparable within one answer only
    parent_span: tuple[int, int] | None = None  # characters of the parent document, for a chunk of one
    location: Location | None = None  # the passage's page, slide, sheet and headings; a table row's own row
    columns: tuple[str, ...] = ()  # a table row's column names (its chunk's header row)
    reading: float | None = None  # the reader's logit that it answers the question (reading/reader.py), where read

    @classmethod
    def of(cls, number: int, passage: Candidate, span: tuple[int, int], score: float) -> Evidence:
        start, end = span
        parent = (passage.span[0] + start, passage.span[0] + end) if passage.span else None
        location, columns = passage.location, ()
        if is_table(passage):  # line i of a table chunk is its sheet's row rows[0] + i - 1 (readers/tables.py)
            row = location.rows[0] + passage.text.count("\n", 0, start) - 1
            location, columns = replace(location, rows=(row, row)), tuple(row_cells(passage.text.split("\n", 1)[0]))
        return cls(number, passage.source, passage.doc_id, span, passage.text[start:end], float(score), parent,
                   location, columns)

    def quoted(self) -> str:
        """The sentence as an answer quotes it: its line breaks as spaces; a table row with its columns' names; a
        PDF's footnote marks left out (its span still points at the text as read)."""
        if self.columns:
            return ", ".join(f"{name}: {value}" for name, value in zip(self.columns, row_cells(self.text)) if value)
        text = self.text
        if self.location is not None and self.location.page is not None and (notes := _FOOTNOTE.findall(text)):
            marks = re.compile(rf"\b([A-Z][a-z]+)[{''.join(sorted(set(n.strip() for n in notes)))}](?=[\s,;.)]|$)")
            text = _FOOTNOTE.sub("", marks.sub(r"\1", text))
        text = " ".join(text.split())
        return text[:-1] if text.endswith("::") else text  # "::": reStructuredText's mark of a literal block


# A PDF's text layer glues superscripts to words: "Andrew Kadatch1 and Bob Jenkins1\n1Google Inc.". Only where a
# footnote starts a line in the sentence (its digit on a capitalised word) is that digit, after a capitalised
# word, taken for its mark: "Libtasn1", "md5", "2Gb" and "3Com" stay.
_FOOTNOTE = re.compile(r"(?m)^[ \t]*\d(?=[A-Z][a-z])")


def is_table(passage: Candidate) -> bool:
    """A chunk of table rows under its header row (a sheet, a CSV file, a Word table)."""
    return passage.location is not None and passage.location.rows is not None


def row_spans(text: str) -> list[tuple[int, int]]:
    """The rows of a table chunk as its sentences: each line after the header, empty ones left out."""
    spans, position = [], text.find("\n") + 1 if "\n" in text else len(text)
    for line in text[position:].split("\n"):
        if line.strip():
            spans.append((position, position + len(line)))
        position += len(line) + 1
    return spans


_SPLITTING = threading.Lock()  # pysbd's segmenter keeps state between calls


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=True)


# What ends a block of sentences and is none itself: a blank line, a Markdown heading, a reStructuredText heading
# (a line underlined by * = - ~ ^), a bare rule, a man page's header or footer line ("XZ(1)   XZ Utils   XZ(1)") and
# a line in capitals alone (its section headings: NAME, SEE ALSO).
_BREAK = re.compile(r"\n[ \t]*\n\s*|^[ \t]*#{1,6}[ \t][^\n]*$|^[^\n]*\S[^\n]*\n[ \t]*[*=\-~^]{3,}[ \t]*$"
                    r"|^[ \t]*[*=\-~^]{3,}[ \t]*$|^\S+\(\d\w*\)[ \t]{2,}[^\n]*\(\d\w*\)[ \t]*$"
                    r"|^[A-Z][A-Z0-9 _-]{2,}$", re.MULTILINE)
_WORD = re.compile(r"[^\W\d_]{2,}")
# Dots that end no sentence: inside a token (libtasn1.h, os.path, 2.0.1, www.x.org) or opening one (.xz, .bashrc).
# pysbd cut "the .xz format" after "the ."; they are hidden from it (same length, so the spans hold).
_INNER_DOT = re.compile(r"(?<=\w)\.(?=\w)|(?<![\w.])\.(?=[A-Za-z0-9_])")
# A line break that ends a sentence in laid-out text (man pages, option lists, code, bullet lists), where pysbd
# sees only a space: after a line that ends one, before a line that starts an item (a bullet, a numbered step, an
# interpreter prompt; a command-line option where it stands out to the left, not one wrapped into prose), and
# after a short title line over more deeply indented text.
_ITEM = re.compile(r"[ \t]*(?:[•·◦▪*][ \t]|\d{1,2}[.)][ \t]|>>>|\.\.\.[ \t]|\$[ \t])")
_OPTION = re.compile(r"[ \t]*-{1,2}[A-Za-z0-9]")
_ENDS = re.compile(r"[.!?:;][\"')\]’”]*[ \t]*$")


_SPANS_KEPT = 2048  # passages whose spans are kept, by a digest of their text (never the text)
_spans: OrderedDict[bytes, tuple[tuple[int, int], ...]] = OrderedDict()
_SPANS_LOCK = threading.Lock()


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """`split_sentences(text)`, kept for the passages of the last answers (a passage often answers again)."""
    key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    with _SPANS_LOCK:
        if (kept := _spans.get(key)) is not None:
            _spans.move_to_end(key)
            return list(kept)
    spans = split_sentences(text)
    with _SPANS_LOCK:
        _spans[key] = tuple(spans)
        while len(_spans) > _SPANS_KEPT:
            _spans.popitem(last=False)
    return spans


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of `text` (pysbd, rule-based: abbreviations, decimals, quotes), without
    the white space around them. Headings and rules are not sentences, and no sentence runs across a blank line.
    A single line break ends a sentence only where the layout says so (see `_line_cuts`); elsewhere it is a space
    to pysbd (pysbd's own cleaning, which would cut there, moves the offsets; a space of the same length keeps
    them). Pieces of fewer than three words (the stub a passage's cut leaves) are dropped."""
    spans, start = [], 0
    for cut in (*_BREAK.finditer(text), None):
        end = cut.start() if cut else len(text)
        spans += [(a + start, b + start) for a, b in _block_sentences(text[start:end])]
        if cut:
            start = cut.end()
    return spans


def _line_cuts(block: str) -> list[int]:
    """Offsets in `block` of the line breaks that end a sentence (see `_ITEM` and `_ENDS`)."""
    lines = block.split("\n")
    cuts, position = [], 0
    for line, following in zip(lines, lines[1:]):
        position += len(line)
        indent, next_indent = len(line) - len(line.lstrip()), len(following) - len(following.lstrip())
        title = (2 <= len(line.split()) <= 6 and not _OPTION.match(line) and not _ENDS.search(line)
                 and next_indent > indent)
        if (_ENDS.search(line) or _ITEM.match(following) or (_OPTION.match(following) and next_indent < indent)
                or title):
            cuts.append(position)
        position += 1
    return cuts


def _block_sentences(block: str) -> list[tuple[int, int]]:
    if not block.strip():
        return []
    spans, start = [], 0
    for cut in (*_line_cuts(block), len(block)):
        spans += [(a + start, b + start) for a, b in _pysbd_sentences(block[start:cut])]
        start = cut + 1
    return spans


# pysbd's time grows with the square of what it is given (20 KB 0.66 s, 400 KB 211 s): a longer piece goes to it in
# windows of at most this many characters. A window's last sentence may be cut by the window's end, so it is split
# again at the start of the next window, with what follows it: the spans are pysbd's own, found in linear time.
PYSBD_WINDOW = 4000


def _pysbd_segments(text: str) -> list[tuple[int, int]]:
    segments, start = [], 0
    while start < len(text):
        end = min(len(text), start + PYSBD_WINDOW)
        with _SPLITTING:
            sentences = _segmenter().processor(text[start:end]).process()
        found = [(start + a, start + b) for a, b in _located(sentences, text[start:end])]
        if end == len(text) or len(found) < 2:  # the last window, or one sentence longer than a window: kept as cut
            segments += found
            start = end
        else:
            segments += found[:-1]
            start = found[-1][0]
    return segments


def _located(sentences: list[str], text: str) -> list[tuple[int, int]]:
    """Where pysbd's sentences stand in `text`, as its char_span mode finds them (each one's first occurrence, with
    the white space after it, that ends after the one before), by str.find: that mode compiles every sentence into a
    pattern, which crowded the patterns pysbd reuses out of Python's cache of them (half the time it took)."""
    spans, prior = [], 0
    for sentence in sentences:
        scan = 0
        while sentence and (at := text.find(sentence, scan)) >= 0:
            end = at + len(sentence)
            while end < len(text) and text[end].isspace():
                end += 1
            if end > prior:
                spans.append((at, end))
                prior = end
                break
            scan = end
    return spans


# What may end a sentence, or lead pysbd to cut, before a piece's last character: a stop (full-width ones too), a
# list's "1)" or "a)", a bullet, a quotation mark, an asterisk, a carriage return. A piece without any is one
# sentence, and pysbd (most of an answer's evidence time) is not asked: on 53,329 pieces of 17,761 passages it gave
# the same spans for all.
_MAY_CUT = re.compile(r"[.!?…\"\r*•·◦▪。．！？]|\w[)）]")


def _pysbd_sentences(piece: str) -> list[tuple[int, int]]:
    if not piece.strip():
        return []
    hidden = _INNER_DOT.sub("_", piece.replace("\n", " "))
    whole = not _MAY_CUT.search(hidden.strip()[:-1])
    spans = []
    for start, end in [(0, len(piece))] if whole else _pysbd_segments(hidden):
        while start < end and piece[start].isspace():
            start += 1
        while end > start and piece[end - 1].isspace():
            end -= 1
        if len(_WORD.findall(piece[start:end])) >= 3:
            spans.append((start, end))
    return spans


_SENTENCE_END = re.compile(r"[.!?…:;]['\"’”)\]]*$")


def passage_sentences(passage: Candidate, shown: str) -> list[tuple[int, int]]:
    """The sentences of a passage's text as far as the prompt shows it (`shown`; a table chunk's rows), less the
    pieces a cut left: the last one where the prompt's cut ended it, or where a chunk ends without a sentence's
    end; the first one where a chunk starts inside its document with no capital letter (chunks are cut by words,
    so they begin and end mid-sentence). A chunk's only sentence is kept."""
    if is_table(passage):  # rows are its sentences; the last one shown only in part is left out
        rows = row_spans(shown)
        return rows[:-1] if rows and len(passage.text) > len(shown) and rows[-1][1] == len(shown) else rows
    spans = sentence_spans(shown)
    chunk = passage.span is not None
    if spans and spans[-1][1] == len(shown.rstrip()) and (len(passage.text) > len(shown) or (
            chunk and len(spans) > 1 and not _SENTENCE_END.search(shown[slice(*spans[-1])]))):
        spans = spans[:-1]
    if len(spans) > 1 and chunk and passage.span[0] > 0 and spans[0][0] == len(shown) - len(shown.lstrip()) \
            and not shown[spans[0][0]].isupper():
        spans = spans[1:]
    return spans


EXTRACTIVE_SENTENCES = 2  # sentences an extractive answer quotes
_INTRODUCES = re.compile(r":\s*$")


def introduces(sentence: str) -> bool:
    """Whether a line only introduces what follows it: "Encoding basic Python object hierarchies::", "OPTIONS:"."""
    return bool(_INTRODUCES.search(sentence))


# Lines that read badly as an answer unless the question asks for them (`reads_badly`): an interpreter's or a
# shell's example, a command's synopsis ("gzip [ -acdf ] [-S suffix] [ name ... ]", "Usage: asn1Parser [OPTION]
# FILE"), and a heading: a short line with no sentence's end that is no option's line ("-v, --verbose explain what
# is being done") and holds no number.
_EXAMPLE = re.compile(r"\s*(>>>|\.\.\.[ \t]|\$[ \t]|%[ \t])")
_SYNOPSIS = re.compile(r"\s*(usage:\s*)?[\w.+-]+(\s+\[[^\]]*\]){2,}|\s*usage:\s", re.IGNORECASE)
_HEADING_END = re.compile(r"[.!?;)\]\"'’”]\s*$")
# Lines that label what follows rather than say it, whatever their numbers (issue 70): a table of contents' or a
# numbered section's title ("3.4.1 – Functions and Types", "2.3 Error Handling 12") and a man page's NAME line
# ("kill - send a signal to a process").
_SECTION_TITLE = re.compile(r"\s*\d+(\.\d+){2,}\.?\s+[A-Z]|\s*\d+(\.\d+)+\.?\s+[-–—]\s+[A-Z]"
                            r"|\s*\d+(\.\d+)+\.?\s+[A-Z][^.!?]*\s\d+\s*$")  # 1.2.3 Title; 1.2 – Title; 1.2 Title 12
_NAME_LINE = re.compile(r"\s*[\w.+-]+(\s*,\s*[\w.+-]+)*\s+[-–—]\s+\w")
ASKS_FOR_EXAMPLES = re.compile(r"\b(examples?|usage|syntax|synopsis|samples?|invoc\w*|prompt)\b", re.IGNORECASE)


def reads_badly(sentence: Evidence, question: str = "") -> bool:
    """Whether a sentence is an example, a synopsis or a heading (see above) that `question` does not ask for: an
    answer quotes it only when nothing else is left."""
    if sentence.columns:  # a table row reads as its columns' names and values
        return False
    text = sentence.quoted()
    unended = not _HEADING_END.search(text) and not introduces(sentence.text)
    heading = (len(text.split()) <= 8 and unended and not _OPTION.match(text) and not re.search(r"\d", text))
    label = unended and len(text.split()) <= 16 and bool(_SECTION_TITLE.match(text) or _NAME_LINE.match(text))
    return heading or label or (not ASKS_FOR_EXAMPLES.search(question) and bool(_EXAMPLE.match(text) or _SYNOPSIS.match(text)))


def quoted_first(evidence: list[Evidence], sentences: int = EXTRACTIVE_SENTENCES, within: float | None = None,
                 question: str = "") -> list[tuple[Evidence, ...]]:
    """The quotes of an answer, best first, up to `sentences` of them: each a sentence, or a line that introduces
    what follows it (`introduces`) with the sentence after it in its passage (its example), never the label alone.
    Examples, synopses and headings the question does not ask for (`reads_badly`) are passed over while anything
    else is left. The same sentence in two passages (a page copied into two manuals) is quoted once, cited to the
    better-scored passage; after the first, only quotes whose value is `within` of the first's (a shorter answer
    for a little recall: results/answers/fit.md)."""
    readable = [e for e in evidence if not reads_badly(e, question)]
    return _quotes(readable, evidence, sentences, within) or _quotes(evidence, evidence, sentences, within)


def _quotes(candidates: list[Evidence], evidence: list[Evidence], sentences: int,
            within: float | None) -> list[tuple[Evidence, ...]]:
    quotes: list[tuple[Evidence, ...]] = []
    seen: set[str] = set()
    for e in candidates:
        if len(quotes) >= sentences or (quotes and within is not None and quotes[0][0].score - e.score > within):
            break
        quote = (e, following) if introduces(e.text) and (following := _following(e, evidence)) else (e,)
        words = [q.quoted().casefold() for q in quote]
        if introduces(quote[-1].text) or any(w in seen for w in words):
            continue
        quotes.append(quote)
        seen.update(words)
    return quotes


def _following(sentence: Evidence, evidence: list[Evidence]) -> Evidence | None:
    """The next scored sentence after `sentence` in its passage (a stub of fewer than three words is none)."""
    after = [e for e in evidence if e.passage == sentence.passage and e.span[0] >= sentence.span[1] > sentence.span[0]]
    return min(after, key=lambda e: e.span[0], default=None)


def _quote(quote: tuple[Evidence, ...]) -> str:
    return " ".join(e.quoted() for e in quote)


def extractive_answer(evidence: list[Evidence], sentences: int = EXTRACTIVE_SENTENCES,
                      within: float | None = None, question: str = "") -> str:
    """The best evidence sentences themselves as the answer, each with its passage's number: nothing generated,
    so nothing is made up (`Evidence.quoted`: line breaks as spaces, a table row with its columns' names)."""
    quotes = quoted_first(evidence, sentences, within, question)
    return " ".join(f"{_quote(q)} [{q[0].passage}]" for q in quotes) or "The passages hold no sentence to answer from."


NOT_FOUND = "Not found in these sources."


def not_found(evidence: list[Evidence], sentences: int = EXTRACTIVE_SENTENCES, within: float | None = None,
              question: str = "") -> str:
    """What an answer says when its evidence is too weak: that, and the sentences that came closest, cited."""
    quotes = quoted_first(evidence, sentences, within, question)
    closest = "; ".join(f"“{_quote(q)}” [{q[0].passage}]" for q in quotes)
    return f"{NOT_FOUND} The closest: {closest}" if closest else NOT_FOUND


def excerpts(evidence: list[Evidence], count_tokens: Callable[[str], int], budget: int) -> dict[int, list[str]]:
    """The best sentences that fit `budget` tokens (the first always), grouped by passage, in document order:
    what a generator reads instead of whole passages."""
    kept, used = [], 0
    for sentence in evidence:  # best first
        tokens = count_tokens(sentence.text)
        if kept and used + tokens > budget:
            continue
        kept.append(sentence)
        used += tokens
    grouped: dict[int, list[str]] = {}
    for sentence in sorted(kept, key=lambda e: (e.passage, e.span)):
        grouped.setdefault(sentence.passage, []).append(sentence.text)
    return grouped
