"""Small corpora written by the tests, built with the real encoder and real indexes."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config

ASTRONOMY = [
    {"id": "mars", "title": "Mars", "text": "Mars is the fourth planet from the Sun and has two small moons, Phobos and Deimos."},
    {"id": "jupiter", "title": "Jupiter", "text": "Jupiter is the largest planet in the Solar System, a gas giant with a Great Red Spot."},
    {"id": "venus", "title": "Venus", "text": "Venus has a thick carbon dioxide atmosphere and the hottest surface of any planet."},
]
COOKING = [
    {"id": "bread", "title": "Bread", "text": "Bread dough rises because yeast ferments sugar and releases carbon dioxide gas."},
    {"id": "risotto", "title": "Risotto", "text": "Risotto is cooked by adding hot stock to arborio rice a ladle at a time while stirring."},
    # The same passage as in the astronomy source: fusion must merge it and keep both provenances.
    {"id": "mars-copy", "title": "Mars", "text": "Mars is the fourth planet from the Sun and has two small moons, Phobos and Deimos."},
]


def with_remote(tmp_path: Path, url: str, guard: str = "", **team) -> Workspace:
    """A workspace with a local source (cooking) and the gradfuse server at `url` as source `team` (`team`: its
    options, as TOML values; `guard`: the `[guard]` table's lines)."""
    options = "".join(f"{key} = {value}\n" for key, value in team.items())
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "gradfuse.toml"
    config.write_text(f'workspace = "ws"\n[guard]\n{guard}\n[sources.team]\nkind = "gradfuse"\nurl = "{url}"\n{options}')
    ws = Workspace.open(config)
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    return ws


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    write_jsonl(root / "astronomy" / "corpus.jsonl", ASTRONOMY)
    write_jsonl(root / "cooking.jsonl", COOKING)
    return root


@pytest.fixture(scope="session")
def workspace(tmp_path_factory, corpus_dir) -> Workspace:
    """Two real sources: a BEIR folder and a JSONL file. Its answers are generated (the tests of generation, the
    server's streaming and the page use it); the default with the bundled generator, extractive, has its own."""
    ws = Workspace(Config(workspace=tmp_path_factory.mktemp("ws"), answer="generate"))
    ws.index(SourceSpec("astronomy", "beir", str(corpus_dir / "astronomy")))
    ws.index(SourceSpec("cooking", "jsonl", str(corpus_dir / "cooking.jsonl")))
    return ws


# One server per test module, not per session: a test of test_engines.py kills its server to see the source fail.
@pytest.fixture(scope="module")
def chroma_server(tmp_path_factory):
    """Chroma's real server (`chroma run`): its URL, its process (to pause or kill it) and its port."""
    pytest.importorskip("chromadb")
    from urllib.parse import urlsplit

    from live_server import chroma_run

    with chroma_run(tmp_path_factory.mktemp("chroma")) as (url, process):
        yield url, process, urlsplit(url).port


# `make test` runs on two pytest-xdist workers, each test file's tests on one of them (pyproject's addopts: a module's
# engine, cluster or server starts once). Tests that build into the repository's shared benchmark workspaces
# (.gradfuse/bench/...: test_eval, test_ray, test_tune) take this lock, so that no two of them build one source at
# once (the second would be refused: "being built by pid ...").
@pytest.fixture
def bench_workspaces():
    lock_file = Path(__file__).resolve().parents[1] / ".gradfuse" / "bench" / ".tests.lock"
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
