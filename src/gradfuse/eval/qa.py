"""Answer-level metrics of a multi-source QA benchmark, beside ranx's document metrics.

- `answer@k`: does the top-k context contain a gold answer string (SQuAD normalisation: lower case, no
  punctuation, articles or extra spaces)? Only for answers a string match can check: yes/no/maybe answers are
  left out (every passage "contains" them), so such queries do not count in this metric.
- `nll@k`: mean token NLL of the gold answer given the top-k context, under the scoring LM (one forward pass per
  method and query, batched); on the scoring-LM subsample.
- `em`, `f1`: the generator's answer from the top `generate_k` passages against the gold answers (SQuAD EM/F1,
  best over the gold answers), for the methods listed in `[qa] generate`, on the scoring-LM subsample. The bundled
  generator has 135M parameters: these numbers are reported as they are.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass, field

from tqdm import tqdm

from gradfuse.candidate import Candidate

UNCHECKABLE = {"yes", "no", "maybe"}
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_CITATIONS = re.compile(r"\[\d+(?:\s*,\s*\d+)*\]")


@dataclass
class QASettings:
    context_k: list[int] = field(default_factory=lambda: [3, 5])
    nll_k: int = 5
    nll_methods: list[str] | None = None  # the methods whose gold NLL is measured (None: every method)
    generate: list[str] = field(default_factory=list)  # methods whose context the generator answers from
    generate_k: int = 3
    max_new_tokens: int = 24


def normalise(text: str) -> str:
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def checkable(answers: tuple[str, ...]) -> list[str]:
    return [a for a in (normalise(a) for a in answers) if a and a not in UNCHECKABLE]


def answer_in_context(answers: tuple[str, ...], passages: list[str]) -> float | None:
    gold = checkable(answers)
    if not gold:
        return None
    context = normalise(" ".join(passages))
    return float(any(f" {a} " in f" {context} " for a in gold))


def exact_match(prediction: str, answers: tuple[str, ...]) -> float:
    return float(any(normalise(prediction) == normalise(a) for a in answers))


def f1(prediction: str, answers: tuple[str, ...]) -> float:
    best = 0.0
    predicted = normalise(prediction).split()
    for answer in answers:
        gold = normalise(answer).split()
        common = sum((Counter(predicted) & Counter(gold)).values())
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def qa_metrics(evaluation, settings: QASettings, lm_spec: str, doc_tokens: int, progress: bool, *,
               dtype: str = "auto") -> None:
    """Fill `evaluation.extra` (method → metric → query id → value) with the metrics above."""
    from gradfuse.generate import build_messages, make_generator
    from gradfuse.rerank import load_scorer, passage_text

    passages = evaluation.passages

    def top(method: str, query_id: str, k: int) -> list[str]:
        return [key for key, _ in evaluation.outcomes[method][query_id].ranking[:k]]

    def as_candidates(keys) -> list[Candidate]:
        """Ranked keys as candidate records, numbered by their rank."""
        return [Candidate(source, doc_id, text, 0.0, rank, title) for rank, (source, doc_id, title, text)
                in enumerate((passages[key] for key in keys), start=1)]

    def context(method: str, query_id: str, k: int) -> list[Candidate]:
        return as_candidates(top(method, query_id, k))

    for method, outcomes in evaluation.outcomes.items():
        extra = evaluation.extra.setdefault(method, {})
        for query in evaluation.queries:
            if query.query_id not in outcomes:
                continue
            for k in settings.context_k:
                found = answer_in_context(query.answers, [passages[key][3] for key in top(method, query.query_id, k)])
                if found is not None:
                    extra.setdefault(f"answer@{k}", {})[query.query_id] = found
    lm_queries = [q for q in evaluation.queries if q.lm and q.split == "test" and q.answers]
    if not lm_queries:
        return
    scorer = load_scorer(lm_spec, doc_tokens, dtype)
    for query in tqdm(lm_queries, desc=f"{evaluation.bench.name}: gold NLL of each method's top {settings.nll_k}",
                      disable=not progress):
        methods = [m for m, outcomes in evaluation.outcomes.items() if query.query_id in outcomes
                   and (settings.nll_methods is None or m in settings.nll_methods)]
        # Many methods share a top k (the singles of unrelated sources, a pool and its reordering): each distinct
        # context is scored once.
        tops = {m: tuple(top(m, query.query_id, settings.nll_k)) for m in methods}
        distinct = list(dict.fromkeys(tops.values()))
        contexts = [scorer.pack([passage_text(c) for c in as_candidates(keys)], query.text, query.answers[0])
                    for keys in distinct]
        loss_of = dict(zip(distinct, (float(loss) for loss in scorer.losses(contexts))))
        for method in methods:
            evaluation.extra[method].setdefault(f"nll@{settings.nll_k}", {})[query.query_id] = loss_of[tops[method]]
    if not settings.generate:
        return
    generator = make_generator(lm_spec)  # the scoring LM's loaded model, shared (load_local_generator caches it)
    for method in settings.generate:
        if method not in evaluation.outcomes:
            raise ValueError(f"[qa] generate names {method!r}, which is not among the benchmark's methods")
        for query in tqdm(lm_queries, desc=f"{evaluation.bench.name}: answers from {method}", disable=not progress):
            passages_given = context(method, query.query_id, settings.generate_k)
            answer = generator.generate(build_messages(query.text, passages_given),
                                        max_new_tokens=settings.max_new_tokens)
            answer = _CITATIONS.sub("", answer).strip()
            extra = evaluation.extra[method]
            extra.setdefault("em", {})[query.query_id] = exact_match(answer, query.answers)
            extra.setdefault("f1", {})[query.query_id] = f1(answer, query.answers)
            evaluation.answers.setdefault(method, {})[query.query_id] = answer
