"""The shipped reader on WikiQA's test set (evaluation only: its licence forbids shipping what is trained on it, and
nothing here is), beside word overlap, the encoder's cosine and the published numbers of the WikiQA paper (Yang, Yih
and Meek, EMNLP 2015). Part of `make train-reader`; writes results/reader/wikiqa.{md,json}.

- MAP and MRR over the test questions with at least one correct sentence (the paper's protocol);
- answer triggering: a question is answered with its best sentence where that sentence's value passes a threshold
  chosen on WikiQA's dev set for the best F1 (the paper's protocol chose it on dev too); precision: answered
  questions whose sentence is correct, of those answered; recall: of the questions that have a correct sentence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader as training  # noqa: E402

from gradfuse.reading.reader import READER_FILE, pair  # noqa: E402
from gradfuse.reading import support  # noqa: E402
from gradfuse.embedding.encoder import load_encoder  # noqa: E402

FOLDER = training.reader_data.DATA / "wikiqa"
# The paper's best rows (Yang et al. 2015, tables 3 and 4): CNN-Cnt for ranking, CNN-Cnt with all features for
# answer triggering.
PUBLISHED = {"MAP": 0.6520, "MRR": 0.6652, "precision": 0.2834, "recall": 0.3580, "F1": 0.3164}


def questions(split: str) -> list[dict]:
    """Each question with its candidate sentences in their order and their labels."""
    grouped: dict[str, dict] = {}
    for line in open(FOLDER / f"{split}.jsonl", encoding="utf-8"):
        row = json.loads(line)
        q = grouped.setdefault(row["question_id"], {"question": row["question"], "rows": []})
        q["rows"].append(row)
    out = []
    for q in grouped.values():
        rows = sorted(q["rows"], key=lambda r: int(str(r["sentence_id"]).rsplit("-", 1)[-1]))
        out.append({"question": q["question"], "sentences": [r["sentence"] for r in rows],
                    "labels": [int(r["label"]) for r in rows]})
    return out


def values(qs: list[dict]) -> dict[str, list[np.ndarray]]:
    score = training.onnx_logits(READER_FILE)
    encoder = load_encoder()
    logits = score([pair(q["question"], s) for q in qs for s in q["sentences"]])
    out: dict[str, list[np.ndarray]] = {"reader": [], "overlap": [], "cosine": []}
    at = 0
    for q in qs:
        n = len(q["sentences"])
        out["reader"].append(logits[at:at + n])
        at += n
        cosines = encoder.encode_short(q["sentences"]) @ encoder.encode_query(q["question"])
        out["cosine"].append(cosines)
        out["overlap"].append(support.signals(q["question"], q["sentences"], cosines, [1] * n,
                                              only=("overlap",))["overlap"])
    return out


def ranking(qs: list[dict], scored: list[np.ndarray]) -> dict[str, float]:
    aps, rrs = [], []
    for q, v in zip(qs, scored):
        labels = np.array(q["labels"])[np.argsort(-v, kind="stable")]
        if not labels.any():
            continue
        hits = np.cumsum(labels)
        aps.append(float(np.mean([hits[i] / (i + 1) for i in np.flatnonzero(labels)])))
        rrs.append(1.0 / (1 + int(np.flatnonzero(labels)[0])))
    return {"MAP": float(np.mean(aps)), "MRR": float(np.mean(rrs)), "questions": len(aps)}


def triggering(qs: list[dict], scored: list[np.ndarray], threshold: float) -> dict[str, float]:
    answered = correct = 0
    for q, v in zip(qs, scored):
        best = int(np.argmax(v))
        if v[best] >= threshold:
            answered += 1
            correct += q["labels"][best]
    have = sum(any(q["labels"]) for q in qs)
    precision = correct / answered if answered else 0.0
    recall = correct / have
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "F1": f1, "threshold": float(threshold)}


def best_threshold(qs: list[dict], scored: list[np.ndarray]) -> float:
    candidates = np.unique(np.concatenate([[v.max()] for v in scored]))
    return float(max(candidates, key=lambda t: triggering(qs, scored, t)["F1"]))


def main() -> None:
    dev, test = questions("dev"), questions("test")
    dev_values, test_values = values(dev), values(test)
    table = {}
    for name in test_values:
        threshold = best_threshold(dev, dev_values[name])
        table[name] = {**ranking(test, test_values[name]), **triggering(test, test_values[name], threshold)}
    summary = {"test": table, "published (CNN-Cnt)": PUBLISHED, "machine": training.machine(),
               "commit": training.commit(), "test questions": len(test)}
    training.OUT.mkdir(parents=True, exist_ok=True)
    (training.OUT / "wikiqa.json").write_text(json.dumps(summary, indent=1))
    lines = ["# The reader on WikiQA (evaluation only)", "",
             f"`python training/reader_wikiqa.py` (part of `make train-reader`) on {summary['machine']}, commit "
             f"{summary['commit']}: {len(test)} test questions, MAP and MRR over the "
             f"{table['reader']['questions']} with a correct sentence; answer triggering at the threshold with the "
             "best F1 on WikiQA's dev set. Nothing was trained on WikiQA.", "",
             "| scorer | MAP | MRR | triggering precision | recall | F1 |", "|---|---:|---:|---:|---:|---:|"]
    for name, row in [*table.items(), ("published: CNN-Cnt (Yang et al. 2015)", PUBLISHED)]:
        lines.append(f"| {name} | {row['MAP']:.3f} | {row['MRR']:.3f} | {row['precision']:.3f} | "
                     f"{row['recall']:.3f} | {row['F1']:.3f} |")
    (training.OUT / "wikiqa.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
