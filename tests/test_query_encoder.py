"""Queries are embedded by the encoder's ONNX copy: a search never imports torch, and finds what the torch
model's vector finds."""

import subprocess
import sys
import textwrap

import numpy as np
from conftest import ASTRONOMY, COOKING, write_jsonl

from gradfuse.sources.encoder import Encoder
from gradfuse.sources.query_onnx import onnx_file

ASK = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gradfuse import Workspace

    ws = Workspace.open(None, workspace=Path(sys.argv[1]))
    found = ws.search("Which planet has the moons Phobos and Deimos?", method="select", retrieval="hybrid")
    answer = ws.ask("Which planet has the moons Phobos and Deimos?")
    print("first", found.candidates[0].doc_id, "quoted", bool(answer.evidence))
    print("torch imported", "torch" in sys.modules)
""")


def test_a_built_workspace_answers_in_a_process_that_never_imports_torch(tmp_path):
    env_cache = tmp_path / "cache"  # no copy yet: the build exports it
    env = {"GRADFUSE_CACHE": str(env_cache), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    build = textwrap.dedent(f"""
        from pathlib import Path
        from gradfuse import SourceSpec, Workspace
        from gradfuse.config import Config
        ws = Workspace(Config(workspace=Path("{tmp_path / 'ws'}")))
        ws.index(SourceSpec("astronomy", "jsonl", "{write_jsonl(tmp_path / 'a.jsonl', ASTRONOMY)}"))
        ws.index(SourceSpec("cooking", "jsonl", "{write_jsonl(tmp_path / 'c.jsonl', COOKING)}"))
    """)
    built = subprocess.run([sys.executable, "-c", build], env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    assert list((env_cache / "encoders").glob("*.onnx")), "the build exported no ONNX copy"
    asked = subprocess.run([sys.executable, "-c", ASK, str(tmp_path / "ws")], env=env, capture_output=True,
                           text=True, timeout=600)
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert "first mars quoted True" in asked.stdout and "torch imported False" in asked.stdout, asked.stdout


def test_the_onnx_copy_gives_the_torch_models_vectors(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADFUSE_CACHE", str(tmp_path))
    encoder = Encoder("all-MiniLM-L6-v2@float32")  # no copy in this cache: loads torch and exports one
    assert onnx_file(encoder._path).is_file() and encoder._onnx is not None
    texts = ["Which planet has the moons Phobos and Deimos?", "closing price on 2003-09-19", "bread",
             "moons " * 400]  # beyond the model's 256 tokens: cut where sentence-transformers cuts
    by_onnx, by_torch = encoder.encode_short(texts), encoder.encode(texts)
    assert np.abs(by_onnx - by_torch).max() < 1e-5
    assert np.allclose(encoder.encode_query(texts[0]), by_torch[0], atol=1e-5)
