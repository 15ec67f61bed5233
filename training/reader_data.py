"""The reader's training and test material: questions, each with the sentences of its passages (cut as gradfuse
cuts them for an answer) labelled 1 where the sentence holds the answer.

Domains (each split so that no article, report or file is on both sides):
- squad: SQuAD 2.0 dev (CC BY-SA 4.0), split by article: half of its questions are adversarial near misses with no
  answer in their paragraph, whose every sentence is a negative;
- tatqa: TAT-QA span answers from report paragraphs (CC BY 4.0), for testing only (training/reader.py says why):
  its test questions; the sentences of the judged paragraph and of its report's other paragraphs;
- man, nodejs, pydoc: questions written here (training/reader_questions.json) over man pages, Node.js' API docs
  and pydoc's pages of standard-library modules none of which the answer benchmark or the demo reads, split by
  file; the passages are the indexed chunks, negatives the chunk's other sentences and the file's chunks that share
  most of the question's words; a written question with no answer has those as negatives alone. Those over pages
  of the packages kept for evaluation (`kept_for_evaluation`) are tested on, never trained on;
- doc2query: questions a teacher LM wrote for sentences of other man pages (training/doc2query.py,
  training/DOC2QUERY.md), split by page; the passages as for the written ones.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import random
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradfuse.candidate import Candidate
from gradfuse.eval.qa import answer_in_context
from gradfuse.reading.evidence import passage_sentences
from gradfuse.reading.reader import pair
from gradfuse.reading import support
from gradfuse.indexing.build import FILE_CHUNK_OVERLAP, FILE_CHUNK_WORDS
from gradfuse.ingest.documents import IngestReport
from gradfuse.ingest.files import read_files

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("GRADFUSE_DATA", ROOT.parent / "shared" / "data"))
QUESTIONS = Path(__file__).with_name("reader_questions.json")
RENDERED = ROOT / ".gradfuse" / "train" / "rendered"
DOMAINS = ("squad", "tatqa", "man", "nodejs", "pydoc", "doc2query")
TECHNICAL = ("man", "nodejs", "pydoc")
SQUAD_TEST_ARTICLES = 10  # of 35
WRITTEN_TEST_SHARE = 0.3  # of each written domain's files
MAX_SENTENCES = 40  # a test question's sentences read (the first, by word overlap with the question)
NODEJS_DOCS = Path("/usr/share/doc/nodejs/api")
DOC2QUERY = Path(__file__).with_name("doc2query.jsonl")
DOC2QUERY_TEST_SHARE = 0.15  # of its pages
MAN_SECTIONS = ("man1", "man5", "man8")
# Never trained on (issue 70 item 5): the packages kept for evaluation elsewhere, the reading benchmark's families
# (benchmarks/reading/SOURCE.md) and the packages of the answer benchmark's man pages (bench/answers.py), with
# Python 3.11's standard library (whose docstrings are the pydoc domain: tested on only).
EVALUATION_PACKAGES = {
    "valgrind", "coreutils", "git", "xz-utils", "gzip", "tar", "openssh-client", "dpkg", "apt", "make", "findutils",
    "grep", "sed", "procps", "libtasn1-doc", "shared-mime-info", "zlib1g-dev",
    "sqlite3-doc", "sqlite3", "lua5.2-doc", "lua5.2", "gnuplot-doc", "gnuplot", "gnuplot-nox", "gnuplot-data", "jq",
    "tmux", "curl",
    "bzip2", "zstd", "zip", "unzip", "wget", "postgresql-client-15", "postgresql-client-common", "less", "diffutils",
    "patch", "make-guile", "dpkg-dev", "apt-utils",
}
# python3 and its -minimal/-dev packages link their pages to Python 3.11's
EVALUATION_PREFIXES = ("python3.11", "libpython3.11", "python3", "libpython3", "git-", "openssh-", "postgresql-")


@dataclass
class Group:
    """One question and the sentences read for it."""

    domain: str
    key: str  # what the split is by: article, report, file
    question: str
    answerable: bool
    pairs: list[tuple[str, str]] = field(default_factory=list)  # the reader's inputs (reading.reader.pair)
    sentences: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    passages: list[int] = field(default_factory=list)  # each sentence's passage number, from 1
    split: str = "train"


def checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def _sentences(text: str, span_in_parent: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    passage = Candidate("train", "x", text, 0.0, 1, span=span_in_parent)
    return passage_sentences(passage, text)


def _group(domain: str, key: str, question: str, answerable: bool, passages: list[tuple[str, list, list[int]]]) -> Group:
    """`passages`: (text, sentence spans, labels) each."""
    group = Group(domain, key, question, answerable)
    for number, (text, spans, labels) in enumerate(passages, start=1):
        for span, label in zip(spans, labels):
            sentence = text[span[0]:span[1]]
            group.pairs.append(pair(question, sentence))
            group.sentences.append(" ".join(sentence.split()))
            group.labels.append(int(label))
            group.passages.append(number)
    return group


def squad() -> list[Group]:
    records = _read_jsonl(DATA / "squad_v2" / "dev.jsonl")
    titles = sorted({r["title"] for r in records})
    test = set(random.Random("squad").sample(titles, SQUAD_TEST_ARTICLES))
    cut: dict[str, list[tuple[int, int]]] = {}
    groups = []
    for r in records:
        spans = cut.setdefault(r["para_id"], _sentences(r["context"]))
        starts = [(a["start"], a["start"] + len(a["text"])) for a in r["answers"]]
        labels = [int(any(a < e and b > s for a, b in starts)) for s, e in spans]
        if r["answers"] and not any(labels):
            continue  # an answer across a cut the sentence splitter made
        group = _group("squad", r["title"], r["question"], bool(r["answers"]), [(r["context"], spans, labels)])
        group.split = "test" if r["title"] in test else "train"
        groups.append(group)
    return groups


def tatqa() -> list[Group]:
    corpus = {r["id"]: r for r in _read_jsonl(DATA / "tatqa_hybrid" / "corpus.jsonl") if r["id"].startswith("text/")}
    by_report: dict[str, list[dict]] = {}
    for r in corpus.values():
        by_report.setdefault(r["context_uid"], []).append(r)
    qrels: dict[str, set[str]] = {}
    for line in open(DATA / "tatqa_hybrid" / "qrels.tsv", encoding="utf-8"):
        query, doc, relevance = line.rstrip("\n").split("\t")
        if int(relevance) > 0 and doc in corpus:
            qrels.setdefault(query, set()).add(doc)
    groups = []
    for q in _read_jsonl(DATA / "tatqa_hybrid" / "queries.jsonl"):
        if q["answer_type"] != "span" or q["answer_from"] != "text" or not qrels.get(q["id"]):
            continue
        paragraphs = sorted(by_report[q["context_uid"]], key=lambda r: r["id"] not in qrels[q["id"]])[:4]
        passages = []
        for r in paragraphs:
            spans = _sentences(r["text"])
            passages.append((r["text"], spans, [int(answer_in_context(tuple(q["answers"]), [r["text"][a:b]]) == 1.0)
                                                for a, b in spans]))
        if not any(any(labels) for _, _, labels in passages):
            continue
        group = _group("tatqa", q["context_uid"], q["text"], True, passages)
        group.split = "test" if q["split"] == "test" else "train"
        groups.append(group)
    return groups


def man_text(*page: str, check: bool = False) -> str | None:
    """A man page (a name, or "-l", a file) as `man` prints it for 80 columns, without hyphenation, justification
    or overstrikes; None where `man` fails (an error where `check`)."""
    shown = subprocess.run(["man", "--nh", "--nj", "-P", "cat", *page], capture_output=True, text=True,
                           env={**os.environ, "MANWIDTH": "80"}, check=check)
    if shown.returncode != 0:
        return None
    return subprocess.run(["col", "-bx"], input=shown.stdout, capture_output=True, text=True, check=check).stdout


def render(domain: str, name: str) -> str:
    """A written question's file as gradfuse indexes it: a man page as `man` prints it for 80 columns, a module's
    pydoc page, a Node.js API page's Markdown."""
    target = RENDERED / domain / (name if domain == "nodejs" else f"{name}.txt")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        if domain == "man":
            text = man_text(name, check=True)
        elif domain == "pydoc":
            text = subprocess.run(["python3.11", "-m", "pydoc", name], capture_output=True, text=True, check=True,
                                  env={**os.environ, "PAGER": "cat", "MANPAGER": "cat"}).stdout
            text = subprocess.run(["col", "-bx"], input=text, capture_output=True, text=True, check=True).stdout
        else:
            text = (NODEJS_DOCS / name).read_text(encoding="utf-8")
        target.write_text(text, encoding="utf-8")
    return target.read_text(encoding="utf-8")


_chunks: dict[str, dict[str, list[Candidate]]] = {}


def _file_chunks(domain: str, names: set[str]) -> dict[str, list[Candidate]]:
    """The indexed chunks of each of a domain's files, the folder read once (each file is parsed in a worker)."""
    if domain not in _chunks:
        for name in names:
            render(domain, name)
        chunks: dict[str, list[Candidate]] = {}
        for d in read_files(RENDERED / domain, IngestReport(), words=FILE_CHUNK_WORDS, overlap=FILE_CHUNK_OVERLAP):
            name = d.doc_id.split("#")[0]
            name = name if domain == "nodejs" else name.removesuffix(".txt")
            chunks.setdefault(name, []).append(Candidate(domain, d.doc_id, d.text, 0.0, 1, span=d.span,
                                                         location=d.location))
        _chunks[domain] = chunks
    return _chunks[domain]


def _loose(text: str) -> re.Pattern:
    """`text` with any run of white space matching any other."""
    return re.compile(r"\s+".join(re.escape(w) for w in text.split()))


def written_questions() -> tuple[list[dict], set[tuple[str, str]]]:
    """The written questions, and the (domain, file) pairs whose questions are test questions (none trained on)."""
    items = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    files = sorted({(q["domain"], q["file"]) for q in items})
    rng = random.Random("written")
    return items, {f for f in files if rng.random() < WRITTEN_TEST_SHARE}


def domain_chunks(domain: str) -> dict[str, list[Candidate]]:
    """Every indexed chunk of a written domain's files, by file."""
    items, _ = written_questions()
    return _file_chunks(domain, {q["file"] for q in items if q["domain"] == domain})


def written() -> list[Group]:
    items, test = written_questions()
    groups = []
    for q in items:
        chunks = domain_chunks(q["domain"]).get(q["file"], [])
        if not chunks:
            continue
        asked = set(support.content_words(q["question"]))
        near = sorted(chunks, key=lambda c: -len(asked & set(support.content_words(c.text))))
        passages, found = [], False
        if q["kind"] == "answerable":
            evidence = _loose(q["evidence"])
            holding = [c for c in chunks if evidence.search(c.text)]
            if not holding:
                continue  # the evidence is cut across two chunks
            chunk = holding[0]
            where = evidence.search(chunk.text).span()
            spans = passage_sentences(chunk, chunk.text)
            answer = _loose(q["answer"])
            labels = [int(a < where[1] and b > where[0] and bool(answer.search(chunk.text[a:b]))) for a, b in spans]
            found = any(labels)
            if not found:
                continue
            passages.append((chunk.text, spans, labels))
            near = [c for c in near if c is not chunk]
        for chunk in near[: 2 if q["kind"] == "answerable" else 3]:
            spans = passage_sentences(chunk, chunk.text)
            # an overlapping chunk may repeat the answer's sentence: not a negative
            labels = [0] * len(spans)
            if q["kind"] == "answerable" and _loose(q["evidence"]).search(chunk.text):
                continue
            passages.append((chunk.text, spans, labels))
        group = _group(q["domain"], f"{q['domain']}/{q['file']}", q["question"], q["kind"] == "answerable", passages)
        # Pages of packages kept for evaluation, and Python's docstrings, are tested on, never trained on.
        group.split = "test" if (q["domain"], q["file"]) in test or kept_for_evaluation(group) else "train"
        groups.append(group)
    return groups


def evaluation_only(package: str) -> bool:
    return package in EVALUATION_PACKAGES or package.startswith(EVALUATION_PREFIXES)


def page_name(path: Path) -> str:
    """`ls.1.gz` → `ls`."""
    return re.sub(r"\.\w+$", "", path.name.removesuffix(".gz"))


def page_packages() -> dict[Path, str]:
    """Every installed man page of MAN_SECTIONS and the package that installed it (dpkg's file lists)."""
    owners = {}
    for listing in Path("/var/lib/dpkg/info").glob("*.list"):
        package = listing.stem.split(":")[0]
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            path = Path(line)
            if path.parent.name in MAN_SECTIONS and path.parent.parent == Path("/usr/share/man") and path.is_file():
                owners[path] = package
    return owners


_SO = re.compile(r"^\.so\s+(\S+)", re.MULTILINE)


@functools.cache  # chosen_pages and doc2query ask for a page's identity and its exclusion: read it once
def page_files(path: Path) -> list[Path]:
    """The files a man page shows: its link's target, and the pages it includes with `.so` (rbash.1 includes
    bash.1's section on restricted shells; a page of one name may be another's text)."""
    real = path.resolve()
    try:
        text = (gzip.open(real, "rt", errors="replace") if real.suffix == ".gz" else open(real, errors="replace")).read()
    except OSError:
        return [real]
    included = []
    for name in _SO.findall(text):
        target = Path("/usr/share/man") / name
        for candidate in (target.with_name(target.name + ".gz"), target):
            if candidate.exists():
                included.append(candidate.resolve())
                break
    return [real, *included]


def page_identity(path: Path) -> str:
    """One name for every page that shows the same text (a link, or a page that includes another): what pages are
    told apart and split by."""
    return str(page_files(path)[-1])


def excluded_page(path: Path, owners: dict[Path, str], written: set[str]) -> bool:
    """Whether any file `path` shows is a written question's page or belongs to a package kept for evaluation."""
    files = [path, *page_files(path)]
    return any(page_name(f) in written or evaluation_only(owners.get(f, owners.get(path, ""))) for f in files)


def written_man_pages() -> set[str]:
    return {q["file"] for q in json.loads(QUESTIONS.read_text(encoding="utf-8")) if q["domain"] == "man"}


def kept_for_evaluation(group: Group) -> bool:
    """A written question over Python's docstrings or over a page of a package kept for evaluation (the page as
    `man` finds it by name, as render() renders it)."""
    if group.domain == "pydoc":
        return True
    if group.domain != "man":
        return False
    return _kept_page(group.key.split("/", 1)[1])


@functools.cache
def _kept_page(name: str) -> bool:
    found = subprocess.run(["man", "-w", name], capture_output=True, text=True).stdout.split()
    return not found or excluded_page(Path(found[0]), _owners(), set())


@functools.cache
def _owners() -> dict[Path, str]:
    return page_packages()


def render_page(path: Path) -> Path | None:
    """A man page file as `man` prints it for 80 columns, in a folder of its own (read_files reads folders); None
    where it renders to next to nothing."""
    target = RENDERED / "doc2query" / f"{path.parent.name}-{page_name(path)}" / f"{page_name(path)}.txt"
    if not target.exists():
        text = man_text("-l", str(path))
        if text is None or len(text.split()) < 80:
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return target.parent


def page_chunks(folder: Path) -> list[Candidate]:
    return [Candidate("doc2query", d.doc_id, d.text, 0.0, 1, span=d.span, location=d.location)
            for d in read_files(folder, IngestReport(), words=FILE_CHUNK_WORDS, overlap=FILE_CHUNK_OVERLAP)]


def sentence_texts(chunk: Candidate) -> list[str]:
    return [" ".join(chunk.text[a:b].split()) for a, b in passage_sentences(chunk, chunk.text)]


def doc2query() -> list[Group]:
    """The kept teacher questions: the sentence's chunk (label 1 on the sentence) and the page's two other chunks
    sharing most of the question's words (those not holding the sentence)."""
    rows = [json.loads(line) for line in open(DOC2QUERY, encoding="utf-8") if line.strip()]
    owners, written = _owners(), written_man_pages()
    groups, chunks = [], {}
    # Checked again here: a page that a later exclusion covers is never trained on, whenever its rows were made.
    for r in (r for r in rows if r["kept"] and not excluded_page(Path(r["page"]), owners, written)):
        folder = render_page(Path(r["page"]))
        if folder is None:
            continue
        page = chunks.setdefault(r["page"], page_chunks(folder))
        holding = [c for c in page if c.doc_id == r["chunk"]]
        if not holding:
            continue
        asked = set(support.content_words(r["question"]))
        near = sorted((c for c in page if r["sentence"] not in sentence_texts(c)),
                      key=lambda c: -len(asked & set(support.content_words(c.text))))
        passages = []
        for chunk in [holding[0], *near[:2]]:
            texts = sentence_texts(chunk)
            passages.append((chunk.text, passage_sentences(chunk, chunk.text),
                             [int(t == r["sentence"]) for t in texts]))
        if not any(any(labels) for _, _, labels in passages):
            continue  # the page renders otherwise than when the row was made
        identity = page_identity(Path(r["page"]))
        group = _group("doc2query", identity, r["question"], True, passages)
        test = random.Random(f"doc2query/{identity}").random() < DOC2QUERY_TEST_SHARE
        group.split = "test" if test else "train"
        groups.append(group)
    return groups


def all_groups() -> list[Group]:
    return (squad() + tatqa() + (written() if QUESTIONS.exists() else [])
            + (doc2query() if DOC2QUERY.exists() else []))


def training_rows(group: Group, rng: random.Random, negatives: int) -> list[tuple[tuple[str, str], int]]:
    """A training question's pairs: every positive and up to `negatives` negatives, half the most like the question
    by word overlap (near misses), half at random, in a seeded order. Read together: the loss compares them."""
    overlap = support.signals(group.question, group.sentences, np.zeros(len(group.sentences)), group.passages,
                              only=("overlap",))["overlap"]
    positives = [i for i, label in enumerate(group.labels) if label]
    others = sorted((i for i, label in enumerate(group.labels) if not label), key=lambda i: -overlap[i])
    hard = others[: negatives // 2]
    rest = [i for i in others if i not in hard]
    chosen = positives + hard + rng.sample(rest, min(len(rest), negatives - len(hard)))
    rng.shuffle(chosen)
    return [(group.pairs[i], group.labels[i]) for i in chosen]


def trimmed(group: Group) -> Group:
    """A test question with at most MAX_SENTENCES sentences: those sharing most words with it."""
    if len(group.sentences) <= MAX_SENTENCES:
        return group
    overlap = support.signals(group.question, group.sentences, np.zeros(len(group.sentences)), group.passages,
                              only=("overlap",))["overlap"]
    keep = sorted(np.argsort(-overlap, kind="stable")[:MAX_SENTENCES])
    return Group(group.domain, group.key, group.question, group.answerable, [group.pairs[i] for i in keep],
                 [group.sentences[i] for i in keep], [group.labels[i] for i in keep],
                 [group.passages[i] for i in keep], group.split)


__all__ = ["DOMAINS", "TECHNICAL", "Group", "all_groups", "checksum", "kept_for_evaluation", "training_rows",
           "trimmed"]
