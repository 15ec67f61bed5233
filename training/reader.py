"""Train the reader (src/gradfuse/reading/reader.py) from the shipped MiniLM encoder, export it to ONNX int8, and
measure it against the LM-free signals it is meant to beat (`make train-reader`).

    python training/reader.py            # the shipped model, its curve and test table (results/reader/)
    python training/reader.py --lodo     # leave one domain out: trained without it, tested on it

Every domain's test questions are held out by article, report or file (training/reader_data.py). A sentence
answers where the gold answer stands in it at its place. Measured per domain, on test questions:
- answer sentence at 1: the best-scored sentence of an answerable question answers it (reader, word overlap as
  the `support` scorer ranks, the encoder's cosine);
- answerability AUC: how well the best sentence's value tells answerable questions from those with no answer
  (squad's adversarial ones, the written ones), against the `support` model's chance that the passages answer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import random
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader_data  # noqa: E402
from reader_data import DOMAINS, TECHNICAL, Group  # noqa: E402

from gradfuse.reading.reader import READER_FILE, feeds, tokenizer  # noqa: E402
from gradfuse.reading import support  # noqa: E402
from gradfuse.embedding.encoder import DEFAULT_ENCODER, _model_path, load_encoder  # noqa: E402

ROOT = reader_data.ROOT
OUT = ROOT / "results" / "reader"
WORK = ROOT / ".gradfuse" / "train"
SEED = 0
LEARNING_RATE = 1e-4  # 5e-5 had learnt next to nothing after 80 batches
NO_ANSWER_LEARNING_RATE = 1e-2  # the one logit of "no answer" moves as far as it must within one pass
WARMUP = 0.06
NEGATIVES = 7  # per training question, beside its positives (training_rows)
QUESTIONS_PER_BATCH = 6
SQUAD_TRAIN = 1600  # of SQuAD's training articles' questions, half with no answer
TECHNICAL_REPEATS = 2  # the written questions are few and the domain the reader is for: read twice
SQUAD_TEST = 1000  # of its test articles' questions (inference time)
# TAT-QA is never trained on: its dev questions fit how the reader is combined with the other signals
# (bench/fit_support.py), so the reader must not have seen them, and its test questions are the answer benchmark's.
# The written questions over pages of packages kept for evaluation, and over Python's docstrings, are test questions
# (reader_data.kept_for_evaluation).
TRAINED_ON = ("squad", "man", "nodejs", "doc2query")
CURVE_EVERY = 100
# `support` as shipped before the reader (2026-12-04): what the reader is measured against.
SUPPORT_BEFORE = support.SupportModel({"overlap": 7.4157}, {"overlap": 3.0598, "cosine": 6.0701, "bias": -5.8021},
                                      0.18)  # steps between points of the training curve (loss, and a dev slice's answer sentence at 1)


def groups() -> list[Group]:
    """Every domain's questions, built once per version of the data and the written questions."""
    stamp = "-".join(reader_data.checksum(p)[:12] for p in (reader_data.DATA / "squad_v2" / "dev.jsonl",
                                                              reader_data.QUESTIONS, reader_data.DOC2QUERY)
                     if p.exists())
    cache = WORK / f"groups-{stamp}.pkl"
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    made = reader_data.all_groups()
    WORK.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(pickle.dumps(made))
    return made


def training_set(pool: list[Group], without: str | None = None) -> list[list[tuple[tuple[str, str], int]]]:
    """The training questions, each its pairs (training_rows), in a seeded order."""
    rng = random.Random(SEED)
    squad = [g for g in pool if g.domain == "squad" and g.split == "train"]
    squad = rng.sample(squad, min(SQUAD_TRAIN, len(squad)))
    chosen = [g for g in pool if g.domain in TRAINED_ON and g.domain != "squad" and g.split == "train"] + squad
    questions = []
    for g in chosen:
        if g.domain == without:
            continue
        questions += [reader_data.training_rows(g, rng, NEGATIVES)
                      for _ in range(TECHNICAL_REPEATS if g.domain in TECHNICAL else 1)]
    rng.shuffle(questions)
    return questions


def reader_model():
    """The encoder with a linear head over its mean-pooled tokens: the pooling the encoder was trained with (its
    [CLS] token and pooler were never trained to mean anything, and learnt slowly: 0.17 answer@1 after one pass)."""
    import torch
    from transformers import AutoModel

    class MeanPooledLogit(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = AutoModel.from_pretrained(str(_model_path(DEFAULT_ENCODER)))
            self.head = torch.nn.Linear(self.encoder.config.hidden_size, 1)

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return self.head((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9))

    return MeanPooledLogit()


def train(rows, curve_groups: list[Group], label: str):
    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(os.cpu_count() or 1)
    path = _model_path(DEFAULT_ENCODER)
    model = reader_model()
    tok = tokenizer(path)
    steps = math.ceil(len(rows) / QUESTIONS_PER_BATCH)
    # "No answer" is one more choice beside a question's sentences, with a learnt logit: the loss is the softmax
    # cross-entropy of the right choice (any of its answering sentences, or none), so sentences are compared
    # within their question, as an answer reads them. (Sentences scored alone, each against a label, learnt that
    # a sentence like the question is no answer: most negatives near misses, half the questions unanswerable.)
    no_answer = torch.nn.Parameter(torch.zeros(1))
    optimiser = torch.optim.AdamW([{"params": list(model.parameters())},
                                   {"params": [no_answer], "lr": NO_ANSWER_LEARNING_RATE, "weight_decay": 0.0}],
                                  lr=LEARNING_RATE, weight_decay=0.01)
    warm = max(1, int(WARMUP * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm))))
    curve, losses, started = [], [], time.perf_counter()
    model.train()
    for step in range(steps):
        batch = rows[step * QUESTIONS_PER_BATCH:(step + 1) * QUESTIONS_PER_BATCH]
        given = {k: torch.from_numpy(v) for k, v in feeds(tok.encode_batch([p for q in batch for p, _ in q])).items()}
        width = int(given["attention_mask"].sum(1).max())  # padding beyond the longest row costs time, not meaning
        given = {k: v[:, :width] for k, v in given.items()}
        logits = model(**given).reshape(-1)
        loss, at = 0.0, 0
        for question in batch:
            choices = torch.cat([no_answer, logits[at:at + len(question)]])
            right = torch.tensor([not any(y for _, y in question)] + [bool(y) for _, y in question])
            loss = loss - (torch.logsumexp(choices[right], 0) - torch.logsumexp(choices, 0)) / len(batch)
            at += len(question)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        optimiser.zero_grad()
        losses.append(loss.item())
        if (step + 1) % CURVE_EVERY == 0 or step + 1 == steps:
            model.eval()
            at_one = answer_at_one(lambda pairs: torch_logits(model, tok, pairs), curve_groups)
            model.train()
            curve.append({"step": step + 1, "loss": float(np.mean(losses[-CURVE_EVERY:])), "dev answer@1": at_one,
                          "minutes": (time.perf_counter() - started) / 60})
            print(f"[{label}] step {step + 1}/{steps} loss {curve[-1]['loss']:.3f} dev answer@1 {at_one:.3f} "
                  f"{curve[-1]['minutes']:.1f} min", flush=True)
    model.eval()
    return model, curve, (time.perf_counter() - started) / 60, float(no_answer)


def torch_logits(model, tok, pairs) -> np.ndarray:
    import torch

    out = []
    with torch.no_grad():
        for start in range(0, len(pairs), 64):
            given = {k: torch.from_numpy(v) for k, v in feeds(tok.encode_batch(pairs[start:start + 64])).items()}
            out.append(model(**given).reshape(-1).numpy())
    return np.concatenate(out) if out else np.zeros(0)


def answer_at_one(score, pool: list[Group]) -> float:
    answerable = [g for g in pool if g.answerable and any(g.labels)]
    values = score([p for g in answerable for p in g.pairs])
    hits, at = [], 0
    for g in answerable:
        mine = values[at:at + len(g.pairs)]
        at += len(g.pairs)
        hits.append(g.labels[int(np.argmax(mine))])
    return float(np.mean(hits)) if hits else float("nan")


def export(model, target: Path) -> dict:
    """The model as ONNX, then its weights quantised to int8 (dynamic: activations stay float), per channel."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    names = ["input_ids", "attention_mask", "token_type_ids"]
    tok = tokenizer(_model_path(DEFAULT_ENCODER))
    sample = {k: torch.from_numpy(v) for k, v in feeds(tok.encode_batch([("a question", "a sentence"),
                                                                          ("a", "b c")])).items()}
    full = WORK / "reader.float32.onnx"
    with torch.no_grad():
        torch.onnx.export(model, tuple(sample[n] for n in names), str(full), input_names=names,
                          output_names=["logit"], opset_version=17, dynamo=False,
                          dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names}, "logit": {0: "batch"}})
    target.parent.mkdir(parents=True, exist_ok=True)
    # Per channel: one scale per output column kept the technical test questions' answer@1 at 0.415 against the
    # float model's 0.437, where one scale per matrix fell to 0.366.
    quantize_dynamic(str(full), str(target), weight_type=QuantType.QInt8, per_channel=True)
    return {"float32 MB": round(full.stat().st_size / 2**20, 1), "int8 MB": round(target.stat().st_size / 2**20, 1)}


def onnx_logits(path: Path):
    from gradfuse.reading.reader import Reader

    reader = Reader(path)
    return lambda pairs: np.concatenate([reader.logits(pairs[i:i + 64]) for i in range(0, len(pairs), 64)]) \
        if pairs else np.zeros(0)


def auc(positive: list[float], negative: list[float]) -> float:
    if not positive or not negative:
        return float("nan")
    scores = np.array(positive + negative)
    ranks = np.argsort(np.argsort(scores, kind="stable"), kind="stable") + 1.0
    for value in np.unique(scores):  # ties share their mean rank
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    return float((ranks[:len(positive)].sum() - len(positive) * (len(positive) + 1) / 2) / (len(positive) * len(negative)))


def evaluate(score, pool: list[Group]) -> dict:
    """Per domain: answer sentence at 1 by the reader, word overlap and cosine; answerability AUC by the reader's
    best logit and by `support`'s chance."""
    encoder = load_encoder()
    out = {}
    for domain in DOMAINS:
        mine = [reader_data.trimmed(g) for g in pool if g.domain == domain]
        if not mine:
            continue
        values = score([p for g in mine for p in g.pairs])
        rows, at = {"reader": [], "overlap": [], "cosine": []}, 0
        best = {"reader": ([], []), "support": ([], [])}
        for g in mine:
            logits = values[at:at + len(g.pairs)]
            at += len(g.pairs)
            cosines = encoder.encode_short(g.sentences) @ encoder.encode_query(g.question)
            found = support.signals(g.question, g.sentences, cosines, g.passages, only=support.READ_BY_ANSWERED)
            if g.answerable:
                for name, v in (("reader", logits), ("overlap", found["overlap"]), ("cosine", cosines)):
                    rows[name].append(g.labels[int(np.argmax(v))])
            side = 0 if g.answerable else 1
            best["reader"][side].append(float(logits.max()))
            best["support"][side].append(support.answered(found, SUPPORT_BEFORE))
        out[domain] = {"questions": len(mine), "answerable": sum(g.answerable for g in mine),
                       **{f"answer@1 {k}": float(np.mean(v)) for k, v in rows.items()},
                       **{f"AUC {k}": auc(*v) for k, v in best.items()}}
    return out


def machine() -> str:
    from gradfuse.hardware import cpu_description

    import torch

    return f"{cpu_description()}, torch {torch.__version__}"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def test_pool(pool: list[Group]) -> list[Group]:
    rng = random.Random(SEED)
    squad = [g for g in pool if g.domain == "squad" and g.split == "test"]
    return [g for g in pool if g.domain != "squad" and g.split == "test"] + rng.sample(squad, min(SQUAD_TEST, len(squad)))


def curve_pool(pool: list[Group]) -> list[Group]:
    """A small fixed slice of test questions (one of each 8 written, 100 of SQuAD's) for the training curve."""
    tests = test_pool(pool)
    return [reader_data.trimmed(g) for g in tests if g.domain in TECHNICAL][::8] + \
        [g for g in tests if g.domain == "squad"][:100]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lodo", action="store_true", help="leave each domain out in turn (results/reader/lodo.*)")
    parser.add_argument("--evaluate", action="store_true",
                        help="only test the model the last training wrote (its record: .gradfuse/train/training.json)")
    args = parser.parse_args()
    started = time.perf_counter()
    pool = groups()
    tests = test_pool(pool)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.lodo:
        return lodo(pool, tests, started)
    record = WORK / "training.json"
    if not args.evaluate:
        rows = training_set(pool)
        model, curve, minutes, no_answer = train(rows, curve_pool(pool), "reader")
        sizes = export(model, READER_FILE)
        record.write_text(json.dumps({
            "made_by": "make train-reader (python training/reader.py)", "date": str(date.today()), "commit": commit(),
            "machine": machine(), "seed": SEED, "questions read": len(rows), "pairs": sum(len(q) for q in rows),
            "questions per batch": QUESTIONS_PER_BATCH, "learning rate": LEARNING_RATE, "no-answer logit": no_answer,
            "training minutes": minutes, "sizes": sizes, "curve": curve}, indent=1))
    summary = json.loads(record.read_text())
    summary["test"] = {"int8": evaluate(onnx_logits(READER_FILE), tests),
                       "float32": evaluate(onnx_logits(WORK / "reader.float32.onnx"), tests)}
    summary["minutes"] = summary["training minutes"] + (time.perf_counter() - started) / 60
    summary["data"] = {name: reader_data.checksum(path) for name, path in (
        ("squad_v2/dev.jsonl sha256", reader_data.DATA / "squad_v2" / "dev.jsonl"),
        ("tatqa_hybrid/queries.jsonl sha256", reader_data.DATA / "tatqa_hybrid" / "queries.jsonl"),
        ("training/reader_questions.json sha256", reader_data.QUESTIONS),
        ("training/doc2query.jsonl sha256", reader_data.DOC2QUERY)) if path.exists()}
    summary["questions"] = {d: {s: sum(g.domain == d and g.split == s for g in pool) for s in ("train", "test")}
                            for d in DOMAINS}
    summary["written questions dropped"] = len(json.loads(reader_data.QUESTIONS.read_text())) - sum(
        g.domain in TECHNICAL for g in pool)
    (OUT / "results.json").write_text(json.dumps(summary, indent=1))
    (OUT / "results.md").write_text(report(summary))
    print(report(summary))


def lodo(pool: list[Group], tests: list[Group], started: float) -> None:
    """Each trained-on domain left out in turn, the technical ones first; written after each (a stopped run keeps
    what it measured). TAT-QA, never trained on, is in the shipped model's own table."""
    table = {}
    for domain in sorted(TRAINED_ON, key=lambda d: d not in TECHNICAL):
        rows = training_set(pool, without=domain)
        model, _, minutes, _ = train(rows, [g for g in curve_pool(pool) if g.domain != domain], f"without {domain}")
        tok = tokenizer(_model_path(DEFAULT_ENCODER))
        table[domain] = {**evaluate(lambda pairs: torch_logits(model, tok, pairs),
                                    [g for g in tests if g.domain == domain])[domain],
                         "pairs": sum(len(q) for q in rows), "training minutes": minutes}
        (OUT / "lodo.json").write_text(json.dumps({"machine": machine(), "commit": commit(), "table": table,
                                                    "minutes": (time.perf_counter() - started) / 60}, indent=1))
        (OUT / "lodo.md").write_text(lodo_report(table))
    print(lodo_report(table))


def _table(rows: dict) -> list[str]:
    lines = ["| domain | test questions | answerable | answer@1 reader | overlap (`support`) | cosine | "
             "answerable? AUC reader | `support` |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for domain, r in rows.items():
        lines.append(f"| {domain} | {r['questions']} | {r['answerable']} | {r['answer@1 reader']:.3f} | "
                     f"{r['answer@1 overlap']:.3f} | {r['answer@1 cosine']:.3f} | {r['AUC reader']:.3f} | "
                     f"{r['AUC support']:.3f} |")
    return lines


def report(s: dict) -> str:
    lines = ["# The reader: trained here, tested on articles, reports and files it did not see", "",
             f"Made by `{s['made_by']}` on {s['date']} at commit {s['commit']}, on {s['machine']}: {s['pairs']} "
             f"training pairs ({s['questions read']} questions, {s['questions per batch']} a batch), one pass, seed {s['seed']}, {s['training minutes']:.1f} min of "
             f"training ({s['minutes']:.1f} min in all). ONNX: {s['sizes']['float32 MB']} MB float32, "
             f"{s['sizes']['int8 MB']} MB int8 (shipped).", "",
             "Test questions per domain (answer@1: the best-scored sentence of an answerable question answers it; "
             "AUC: the best sentence's value tells answerable questions from those with no answer), the shipped "
             "int8 model:", "", *_table(s["test"]["int8"]), "", "The same model in float32 (its ONNX copy before quantisation):", "",
             *_table(s["test"]["float32"]), "", "Training curve (loss over the last steps; answer@1 on a fixed "
             "slice of test questions):", "", "| step | loss | answer@1 | minutes |", "|---:|---:|---:|---:|"]
    lines += [f"| {p['step']} | {p['loss']:.3f} | {p['dev answer@1']:.3f} | {p['minutes']:.1f} |" for p in s["curve"]]
    lines += ["", "Questions (train / test): " + "; ".join(f"{d} {c['train']} / {c['test']}" for d, c in
                                                         s["questions"].items())]
    return "\n".join(lines) + "\n"


def lodo_report(table: dict) -> str:
    return "\n".join(["# Leave one domain out", "", "Each row: the reader trained without that domain (the same "
                      "recipe, `python training/reader.py --lodo`; float32, in torch), tested on its test questions, "
                      "beside the LM-free signals on the same questions. TAT-QA, never trained on, is in "
                      "[results.md](results.md).", "", *_table(table)]) + "\n"


if __name__ == "__main__":
    main()
