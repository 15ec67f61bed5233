"""Questions a teacher LM writes for sentences of man pages (doc2query), filtered, for training the reader
(issue 70 item 5; `make doc2query`, then `make train-reader`).

Pages: man pages of sections 1, 5 and 8 installed here, rendered as gradfuse indexes them (`man` for 80 columns),
from Debian packages other than those kept for evaluation (reader_data.EVALUATION_PACKAGES: those issue 70 names, the
reading benchmark's families, the answer benchmark's pages) and other than the pages of the written questions
(training/reader_questions.json). A seeded sample, at most PAGES_PER_PACKAGE pages of a package.

Sentences: those that say something (SAY_WORDS content words or more, ending with a full stop: no label, heading
or synopsis), at most SENTENCES_PER_PAGE of a page, spread over its chunks.

Teacher: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, Apache-2.0 upstream; bench/llm_server.py joins it from its PyPI
parts and checks the sha256) behind llama.cpp's OpenAI-compatible server, greedy, shown the sentence with the two
sentences on each side and asked for one question the sentence answers, in other words than the sentence's.

Kept only where (the filter; every drop is counted by reason in the card's numbers):
- the output is one question (ends with "?", 4 to 30 words);
- it does not copy the sentence: no run of COPIED_RUN words of the sentence stands in it;
- the question's best sentence, by the shipped encoder's cosine among every sentence of the sentence's chunk, is the
  sentence it came from (round-trip consistency).

Rows append to training/doc2query.jsonl as they are made (a stopped run keeps them and resumes past them).

    python training/doc2query.py --minutes 45     # make doc2query
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "training")]
import reader_data  # noqa: E402
from llm_server import GGUFS, LICENCE, served  # noqa: E402

from gradfuse.candidate import Candidate  # noqa: E402
from gradfuse.embedding.encoder import load_encoder  # noqa: E402
from gradfuse.reading import support  # noqa: E402

PAIRS = reader_data.DOC2QUERY
CARD = Path(__file__).with_name("DOC2QUERY.md")
TEACHER = "qwen0.5b"
SEED = 0
PAGES_PER_PACKAGE = 10
SENTENCES_PER_PAGE = 6
SAY_WORDS = 6
COPIED_RUN = 5
CONTEXT_SENTENCES = 2
_BOILERPLATE = re.compile(r"manual page|man page|was written by|copyright|license|free software", re.IGNORECASE)
PROMPT = ("Here is part of the manual page of {page}.\n\n{context}\n\nWrite one question that a user of this "
          "program would ask and that this sentence of it answers:\n\"{sentence}\"\n\nUse your own words, not the sentence's. Reply "
          "with the question only.")


def chosen_pages(owners: dict[Path, str]) -> list[tuple[Path, str]]:
    """A seeded sample of the pages no evaluation keeps, one name for each page's text (a link or an included page
    is the page it shows)."""
    written = reader_data.written_man_pages()
    by_package: dict[str, list[Path]] = {}
    seen: set[str] = set()
    for path, package in sorted(owners.items()):
        identity = reader_data.page_identity(path)
        if identity not in seen and not reader_data.excluded_page(path, owners, written):
            seen.add(identity)
            by_package.setdefault(package, []).append(path)
    rng = random.Random(SEED)
    pages = [(path, package) for package, paths in sorted(by_package.items())
             for path in rng.sample(paths, min(PAGES_PER_PACKAGE, len(paths)))]
    rng.shuffle(pages)
    return pages


def says(sentence: str) -> bool:
    # A label, a heading or a synopsis does not end with a full stop.
    return (len(support.content_words(sentence)) >= SAY_WORDS and sentence.endswith(".") and len(sentence) <= 400
            and not _BOILERPLATE.search(sentence))


def picked(chunks: list[Candidate], rng: random.Random) -> list[tuple[Candidate, str, str]]:
    """Up to SENTENCES_PER_PAGE sentences that say something, at most two of a chunk, each with the sentences
    around it (CONTEXT_SENTENCES on each side: what the teacher is shown, as its prompt costs most of its time)."""
    options = []
    for chunk in chunks:
        sentences = reader_data.sentence_texts(chunk)
        good = [i for i, s in enumerate(sentences) if says(s)]
        for i in rng.sample(good, min(2, len(good))):
            around = " ".join(sentences[max(0, i - CONTEXT_SENTENCES):i + CONTEXT_SENTENCES + 1])
            options.append((chunk, sentences[i], around))
    return rng.sample(options, min(SENTENCES_PER_PAGE, len(options)))


def copies(question: str, sentence: str) -> bool:
    words = sentence.lower().split()
    asked = " ".join(question.lower().split())
    return any(" ".join(words[i:i + COPIED_RUN]) in asked for i in range(len(words) - COPIED_RUN + 1))


def verdict(question: str, sentence: str, chunk: Candidate, encoder) -> str:
    """"kept", or why the question is dropped."""
    if not question.endswith("?") or "\n" in question or not 4 <= len(question.split()) <= 30:
        return "not one question"
    if copies(question, sentence):
        return "copies the sentence"
    sentences = reader_data.sentence_texts(chunk)
    vectors = encoder.encode([question, *sentences])
    cosines = vectors[1:] @ vectors[0]
    best = sentences[int(np.argmax(cosines))]
    return "kept" if best == sentence else "another sentence is nearer"


def done_keys() -> set[str]:
    if not PAIRS.exists():
        return set()
    return {json.loads(line)["key"] for line in open(PAIRS, encoding="utf-8") if line.strip()}


def generate(minutes: float) -> Counter:
    from openai import OpenAI

    owners = reader_data.page_packages()
    pages = chosen_pages(owners)
    versions = dict(line.split("\t") for line in subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${Version}\n"], capture_output=True, text=True,
        check=True).stdout.splitlines() if "\t" in line)
    encoder, seen, outcomes = load_encoder(), done_keys(), Counter()
    deadline = time.monotonic() + minutes * 60
    with served(TEACHER) as url, open(PAIRS, "a", encoding="utf-8") as out:
        client = OpenAI(base_url=f"{url}/v1", api_key=os.environ["LLM_KEY"])
        for number, (path, package) in enumerate(pages):
            if time.monotonic() > deadline:
                break
            rendered = reader_data.render_page(path)
            if rendered is None:
                outcomes["page not rendered"] += 1
                continue
            rng = random.Random(f"{SEED}/{path}")
            for chunk, sentence, around in picked(reader_data.page_chunks(rendered), rng):
                key = f"{path.name}/{chunk.doc_id}/{sentence[:60]}"
                if key in seen:
                    continue
                reply = client.chat.completions.create(
                    model="teacher", temperature=0.0, max_tokens=48,
                    messages=[{"role": "user", "content": PROMPT.format(page=reader_data.page_name(path), context=around,
                                                                         sentence=sentence)}])
                question = " ".join((reply.choices[0].message.content or "").strip().strip('"').split())
                outcome = verdict(question, sentence, chunk, encoder)
                outcomes[outcome] += 1
                out.write(json.dumps({"key": key, "package": package, "version": versions.get(package, ""),
                                      "page": str(path), "chunk": chunk.doc_id, "sentence": sentence,
                                      "question": question, "kept": outcome == "kept", "outcome": outcome}) + "\n")
                out.flush()
            if number % 20 == 0:
                print(f"{number} pages, {dict(outcomes)}", flush=True)
    return outcomes


def write_card() -> None:
    rows = [json.loads(line) for line in open(PAIRS, encoding="utf-8") if line.strip()]
    outcomes = Counter(r["outcome"] for r in rows)
    owners, written = reader_data.page_packages(), reader_data.written_man_pages()
    excluded = [r for r in rows if r["kept"] and reader_data.excluded_page(Path(r["page"]), owners, written)]
    kept = [r for r in rows if r["kept"] and r not in excluded]
    packages = sorted({(r["package"], r["version"]) for r in kept})
    examples = "\n".join(f"- {r['question']}  \n  ← {r['sentence']}" for r in random.Random(SEED).sample(kept, 5))
    CARD.write_text(f"""# doc2query pairs for the reader

Made by `make doc2query` (`python training/doc2query.py`), {date.today()}: questions that
Qwen2.5-Coder-0.5B-Instruct ({GGUFS[TEACHER][0]}; licence {LICENCE}) wrote for sentences of man pages installed on
this machine, filtered as training/doc2query.py says. The reader trains on the kept rows (`make train-reader`).

- written: {len(rows)}; kept by the filter: {outcomes["kept"]}; dropped: {", ".join(
    f"{n} {why}" for why, n in outcomes.most_common() if why != "kept")}; of the kept, {len(excluded)} are over pages
  excluded after they were written (reader_data.excluded_page, checked again when the reader trains), which leaves
  **{len(kept)}** to train on
- {len({r['page'] for r in kept})} man pages of {len(packages)} Debian packages (each row names its package and
  version; each page's licence is its package's, in /usr/share/doc/PACKAGE/copyright: Debian main, free to
  redistribute). Never a source: the packages issue 70 keeps for evaluation, the reading benchmark's families, the
  answer benchmark's pages and the written questions' pages (`EVALUATION_PACKAGES` in training/reader_data.py).
- Use: training the reader only; not evaluation data. The teacher's questions are its own; some are imperfect
  (a filter, not a check by hand).

Examples (seeded sample):
{examples}
""", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=45.0, help="stop making pairs after this long")
    parser.add_argument("--card-only", action="store_true", help="rewrite DOC2QUERY.md from the pairs made")
    args = parser.parse_args()
    if not args.card_only:
        print(dict(generate(args.minutes)))
    write_card()
    return 0


if __name__ == "__main__":
    sys.exit(main())
