"""The `support` evidence scorer: which sentences of an answer's passages hold its answer, from signals that need no
language model (an answer's evidence costs milliseconds instead of a pass of the scoring LM), and how likely it is
that any of them does (below `[evidence] abstain_below` the answer says "not found in these sources").

The signals of a sentence s for a question q (`SIGNALS`):
- plain: the share of q's content words that s holds, nothing weighed (the plainest signal: a fitted combination
  ships only where it beats it on every question set left out of its fit);
- overlap: the share of q's content words that s holds, each weighted by its rarity among the passages' sentences
  (a word every sentence has says little; a word of q that no sentence has weighs most); before: the overlap of
  the sentence before s in its passage; passage: the overlap of s's whole passage;
- typed: s holds what q asks for and does not already say: a year or date for "when", a number for "how many" or
  "what size", a command-line option or identifier for "which option", a name for "who" and "where"; exact: the
  share of q's exact tokens (2003-09-19, lz4, --amend) s holds as written;
- cosine: the encoder's cosine of q and s;
- words: how long s is (log of its content words); novel: the share of its words q does not hold; label: s only
  introduces what follows (ends with a colon) or is a short line without a sentence's end;
- rank: 1 / its passage's number; first: s opens its passage;
- reader: the logit of the reader trained here (reading/reader.py) that s answers q (it reads s alone).

A sentence's value is a weighted sum of the signals that selection on held-out question sets chose (a conditional
logit over each question's sentences; today overlap alone); the chance that the passages answer at
all is a logistic model of a few answer-level features (`ANSWERED`; today the best overlap and the best cosine).
`bench/fit_support.py` fits both away from the test questions and stores them beside this file (support.json,
with the command and the data that made them; results/answers/fit.md).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

from gradfuse.reading.evidence import introduces, quoted_first

SIGNALS = ("plain", "overlap", "typed", "cosine", "words", "rank", "first", "label", "novel", "before", "passage", "exact",
           "reader")
MODEL_FILE = Path(__file__).with_name("support.json")

_STOP = frozenset("""a an the of in on at to for from by with about as into through over under and or but if then than
so is are was were be been being am do does did done have has had having it its this that these those there here what
which who whom whose when where why how i you he she we they me him her us them my your his our their not no can could
should would may might must will shall also only just very more most much many any some each every all both few other
such own same too one get gets use used using make makes happen happens happened""".split())  # a question's frame
_WORD = re.compile(r"[A-Za-z0-9]+(?:[._'-][A-Za-z0-9]+)*")

# What a question asks for, by its words, and how a sentence shows one (a value the question does not hold).
_ASKS = (
    ("date", re.compile(r"\b(when|what year|which year|what date|what day|since when)\b")),
    ("number", re.compile(r"\bhow (many|much|long|old|far|big|large|high|tall|often|fast|slow|slower)\b|\bwhat "
                          r"(percentage|percent|proportion|number|amount|rate|size|value|price|cost|age|length|"
                          r"height|population|total|ratio|share|port|level|version|unit|limit|width|depth|factor)\b")),
    ("code", re.compile(r"\b(option|flag|switch|command|argument|parameter|variable|function|method|module|file|"
                        r"header|program|utility|tool|setting|keystrokes?)\b")),
    ("name", re.compile(r"\bwho(m|se)?\b|\bwhere\b|\bwhat (name|company|country|city|magazine|band|film)\b")),
)
_YEAR = re.compile(r"\b(1[5-9]\d\d|20\d\d)\b")
_DATE = re.compile(r"\b(January|February|March|April|May|June|July|August|September|October|November|December)\b|"
                   r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b")
_NUMBER = re.compile(r"(?<![\w.])[-+$€£]?\d[\d,]*(?:\.\d+)?(?:%|\s?[kKMG]i?B?\b)?")
_CODE = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*(=\S+)?|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\b\w+\(\)|\b\w+\.\w+\b|~\.")
_NAME = re.compile(r"\b[A-Z][a-z]+(?:\s+(?:[A-Z][a-z]+|of|the|de|van|von))*")


def content_words(text: str) -> list[str]:
    """Lower-cased words less the common ones, their endings folded ("closing", "closed", "close" → "clos")."""
    return [_stem(word) for word in _WORD.findall(text.lower()) if word not in _STOP]


@lru_cache(maxsize=16384)  # an answer's ~50 sentences are read by its value and again by its "not found" model
def word_set(text: str) -> frozenset[str]:
    """`content_words` of `text`, each once."""
    return frozenset(content_words(text))


def _stem(word: str) -> str:
    """A light suffix fold for plain words (names with digits or punctuation stay whole: 2003-09-19, libtasn1.h)."""
    if not word.isalpha():
        return word
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix) and not word.endswith("ss"):
            word = word[: -len(suffix)]
            break
    return word[:-1] if len(word) > 4 and word.endswith("e") else word


def asks_for(question: str) -> str | None:
    lowered = question.lower()
    return next((kind for kind, cue in _ASKS if cue.search(lowered)), None)


def holds_asked(kind: str | None, sentence: str, question: str) -> bool:
    """Whether `sentence` holds a value of the kind `question` asks for that the question does not hold itself."""
    if kind is None:
        return False
    if kind == "date":
        return any(y not in question for y in _YEAR.findall(sentence)) or bool(_DATE.search(sentence))
    if kind == "number":
        return any(n.strip() not in question for n in _NUMBER.findall(sentence))
    if kind == "code":
        return any(m.group() not in question for m in _CODE.finditer(sentence))
    lowered = question.lower()
    return any(name.lower() not in lowered for name in _NAME.findall(sentence))


@dataclass(frozen=True)
class SupportModel:
    weights: dict[str, float]  # signal → weight of a sentence's value
    answered: dict[str, float]  # ANSWERED feature (and "bias") → coefficient of the model of "the passages answer"
    abstain_below: float  # `[evidence] abstain_below`'s default, chosen on the same dev questions
    second_within: float | None = None  # an answer quotes a second sentence only this close to the first's value

    @classmethod
    def load(cls, path: Path = MODEL_FILE) -> SupportModel:
        stored = json.loads(path.read_text())
        return cls(stored["weights"], stored["answered"], stored["abstain_below"], stored.get("second_within"))


@cache
def model() -> SupportModel:
    return SupportModel.load()


_FINAL = re.compile(r"[.!?;)\]\"'’”]\s*$")


def signals(question: str, sentences: list[str], cosines: np.ndarray, passages: list[int] | None = None,
            only: tuple[str, ...] = SIGNALS, reader: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The signals `only` names (every one unless told) of every sentence (see the module's text), as arrays in the
    sentences' order: an answer computes those its model reads, a fit all of them. `passages`: each sentence's
    passage number (a passage's sentences in their order); None: every sentence is its own passage. `reader`: the
    reader's logits, needed where `only` names it."""
    if "reader" in only and reader is None:
        raise ValueError("the reader signal needs the reader's logits of the sentences (reading/reader.py)")
    passages = list(range(1, len(sentences) + 1)) if passages is None else list(passages)
    asked = word_set(question)
    held = [word_set(s) for s in sentences]
    weight = {w: math.log((len(sentences) + 1) / (sum(w in h for h in held) + 0.5)) for w in asked}
    total = sum(weight.values()) or 1.0
    overlap = np.array([sum(weight[w] for w in weight if w in h) / total for h in held])
    first = [i == 0 or passages[i - 1] != passages[i] for i in range(len(sentences))]

    def in_passage() -> np.ndarray:
        words: dict[int, set[str]] = {}
        for number, h in zip(passages, held):
            words.setdefault(number, set()).update(h)
        return np.array([sum(weight[w] for w in weight if w in words[n]) / total for n in passages])

    kind = asks_for(question)
    made = {
        "plain": lambda: np.array([len(asked & h) / max(1, len(asked)) for h in held]),
        "overlap": lambda: overlap,
        "typed": lambda: np.array([float(holds_asked(kind, s, question)) for s in sentences]),
        "cosine": lambda: np.asarray(cosines, dtype=float),
        "words": lambda: np.array([math.log1p(len(h)) for h in held]),
        "rank": lambda: np.array([1.0 / number for number in passages]),
        "first": lambda: np.array(first, dtype=float),
        "label": lambda: np.array([float(introduces(s) or (len(s.split()) <= 8 and not _FINAL.search(s)))
                                   for s in sentences]),
        "novel": lambda: np.array([len(h - asked) / len(h) if h else 0.0 for h in held]),
        "before": lambda: np.array([0.0 if first[i] else overlap[i - 1] for i in range(len(sentences))]),
        "passage": in_passage,
        "exact": lambda: exact_share(question, sentences),
        "reader": lambda: _unread_lowest(np.asarray(reader, dtype=float)),
    }
    return {name: made[name]() for name in only}


def _unread_lowest(logits: np.ndarray) -> np.ndarray:
    """The reader's logits, where a sentence it did not read (NaN: reading.reader.to_read) counts as the lowest read."""
    read = logits[~np.isnan(logits)]
    return np.where(np.isnan(logits), read.min() if len(read) else 0.0, logits)


_TOKEN = re.compile(r"(?<![\w-])[\w.:/~+-]*\d[\w.:/~+-]*|(?<![\w-])--?[A-Za-z][\w-]*")


def exact_share(question: str, sentences: list[str]) -> np.ndarray:
    """Per sentence, the share of the question's exact tokens (with a digit: 2003-09-19, 3.11, lz4; or an option:
    --amend, -r) that it holds as written; 0 where the question has none."""
    tokens = {t.strip(".:") for t in _TOKEN.findall(question)} - {""}
    if not tokens:
        return np.zeros(len(sentences))
    return np.array([sum(t in s for t in tokens) / len(tokens) for s in sentences])


def quoted_signals(question: str, evidence, encoder, encoded: int | None = None) -> dict[str, np.ndarray]:
    """The signals of an answer's scored sentences (`Evidence` records) as the answer quotes them: a table row with
    its column names ("Date: 2003-09-19, Close: 29.96"), which a row's bare values lack. Read in the passages'
    order, returned in the evidence's. Every sentence is encoded for its cosine (`encoded`: only the first that many
    of `evidence`, the others' cosine counted as -1, the lowest there is): the eight best by value alone missed the
    sentence that answers a question in other words than its own (the demo's "with" and JSON questions, declined
    with them), so a shorter list only decides where it cannot change the decision (`chance`)."""
    order = sorted(range(len(evidence)), key=lambda i: (evidence[i].passage, evidence[i].span))
    texts = [evidence[i].quoted() for i in order]
    read = read_by(model())
    cosines = np.full(len(texts), -1.0)
    kept = [position for position, i in enumerate(order) if encoded is None or i < encoded]
    if kept:
        cosines[kept] = encoder.encode_short([texts[p] for p in kept]) @ encoder.encode_query(question)
    found = signals(question, texts, cosines, [evidence[i].passage for i in order], only=read,
                    reader=np.array([np.nan if evidence[i].reading is None else evidence[i].reading for i in order])
                    if "reader" in read else None)
    back = np.argsort(order)
    return {name: values[back] for name, values in found.items()}


FIRST_ENCODED = 2  # sentences whose cosine may decide an answer alone (`chance`)


def chance(question: str, evidence, encoder, decide_at: float | None = None) -> tuple[float | None, bool]:
    """(the chance that `evidence` (every sentence of an answer's passages, best first) holds the answer
    (`answered`), whether it is a lower bound); None without sentences. With `decide_at` (`[evidence]
    abstain_below`), no more sentences are encoded than the decision needs: where the model's chance only rises
    with the best cosine (a positive weight, and no sentence value that reads cosines), the best FIRST_ENCODED
    sentences that already clear `decide_at` keep it cleared whatever the others' cosines, and those are not
    encoded. The chance is then a lower bound of the whole one, and the decision the whole one's; below it, every
    sentence is encoded (encoding ~50 sentences was most of an answer's time)."""
    if not evidence:
        return None, False
    fitted = model()
    if decide_at is not None and decides_early(fitted):
        early = answered(quoted_signals(question, evidence, encoder, encoded=FIRST_ENCODED), fitted)
        if early >= decide_at:
            return early, len(evidence) > FIRST_ENCODED
    return answered(quoted_signals(question, evidence, encoder), fitted), False


def decides_early(fitted: SupportModel) -> bool:
    """Whether fewer sentences' cosines can decide "not found" (`chance`): the chance rises with the best cosine
    and reads it nowhere else."""
    return (fitted.answered.get("cosine", 0.0) >= 0 and "cosine" not in fitted.weights
            and "reader" not in read_by(fitted))


def sentence_values(found: dict[str, np.ndarray], weights: dict[str, float]) -> np.ndarray:
    return sum(weights[name] * found[name] for name in weights)


# What the "passages answer" model may read (bench/fit_support.py chooses among sets of them), and the signals
# they are made of beside the sentence values.
ANSWERED = ("best", "overlap", "cosine", "passage", "margin", "reader")
READ_BY_ANSWERED = ("overlap", "cosine", "passage")


def read_by(model: SupportModel) -> tuple[str, ...]:
    """The signals an answer computes for `model`: those its sentence values weigh and its "answered" model reads."""
    answered = ("reader",) if "reader" in model.answered else ()
    return tuple(dict.fromkeys((*READ_BY_ANSWERED, *model.weights, *answered)))


def reads_reader(model: SupportModel) -> bool:
    return "reader" in read_by(model)


def answered_features(found: dict[str, np.ndarray], weights: dict[str, float]) -> dict[str, float]:
    """An answer's features for "the passages answer": its best sentence's value, the best overlap, the best cosine,
    the best passage's overlap, how far the best sentence stands above the second, and the reader's best logit
    (where it was read)."""
    values = np.sort(sentence_values(found, weights))[::-1]
    return {"best": float(values[0]), "overlap": float(found["overlap"].max()), "cosine": float(found["cosine"].max()),
            "passage": float(found["passage"].max()),
            "margin": float(values[0] - values[1]) if len(values) > 1 else 0.0,
            "reader": float(found["reader"].max()) if "reader" in found else 0.0}


def answered(found: dict[str, np.ndarray], model: SupportModel) -> float:
    """The chance that some sentence answers: a logistic model of the answer's features (`answered_features`)."""
    if not len(found["overlap"]):
        return 0.0
    features = answered_features(found, model.weights)
    logit = model.answered["bias"] + sum(value * features[name] for name, value in model.answered.items()
                                         if name != "bias")
    return 1.0 / (1.0 + math.exp(-logit))


# A key a question looks a table row up by: digits, a separator, digits (2003-09-19, 20.04, 4.10); a bare number
# (Debian 10) is too common in a table to be one, and utf-8 or x86-64 are no keys.
_KEY = re.compile(r"(?<![\w.:/-])[\w.:/-]*\d[.:/-]\d[\w.:/-]*")


def looked_up(question: str, evidence) -> bool:
    """Whether the sentence an answer quotes first (`evidence` best first) is a table row holding every key the
    question names (`_KEY`): a lookup the row answers by itself. The "not found" model was fitted on prose, where
    such a row reads as a weak match (a question of words against a row of values: "closing price on 2003-09-19")."""
    keys = {key.rstrip(".:/-") for key in _KEY.findall(question)}
    quotes = quoted_first(evidence, 1)
    if not keys or not quotes or not quotes[0][0].columns:
        return False
    row = quotes[0][0].text
    return all(re.search(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w)", row) for key in keys)


def declines(question: str, evidence, chance: float | None, threshold: float) -> bool:
    """Whether an answer says "not found": its passages' chance of holding the answer (None: nothing was scored)
    is below the threshold, and its first quote is no table row that the question looks up (`looked_up`)."""
    return chance is not None and chance < threshold and not looked_up(question, evidence)
