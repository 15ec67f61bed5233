"""The encoder: passages and queries by its ONNX copy in float32 (a build and a search never import torch once the
copy exists, and its vectors are the torch model's), bf16 only by name and said to be slow where it is emulated,
and one precision per index: a changed encoder rebuilds the whole source, never mixing vectors."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ASTRONOMY, COOKING, write_jsonl

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.hardware import AVX2_ONLY, BF16_CPU_FLAGS, KERNEL_CAPS, cpu_flags
from gradfuse.embedding.encoder import EmbeddingCache, Encoder, load_encoder
from gradfuse.embedding.encoder_names import encoder_name, recorded_encoder
from gradfuse.embedding.onnx_encoder import onnx_file

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
    # With the copy in place, a new source is built without torch too, by the copy.
    rebuild = build.replace("ws.index(SourceSpec(\"cooking\"", "report = ws.index(SourceSpec(\"food\"") + \
        "\nimport sys\nprint('by', report.encoder, 'torch imported', 'torch' in sys.modules)"
    rebuilt = subprocess.run([sys.executable, "-c", rebuild], env=env, capture_output=True, text=True, timeout=600)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert "by all-MiniLM-L6-v2@float32 (onnxruntime) torch imported False" in rebuilt.stdout, rebuilt.stdout


def test_the_onnx_copy_gives_the_torch_models_vectors(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADFUSE_CACHE", str(tmp_path))
    encoder = Encoder("all-MiniLM-L6-v2@float32")  # no copy in this cache: loads torch and exports one
    assert onnx_file(encoder._path).is_file() and encoder._onnx is not None
    texts = ["Which planet has the moons Phobos and Deimos?", "closing price on 2003-09-19", "bread",
             "moons " * 400]  # beyond the model's 256 tokens: cut where sentence-transformers cuts
    by_torch = encoder._passage_model().encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert encoder.backend == "onnxruntime"
    assert np.abs(encoder.encode(texts) - by_torch).max() < 1e-5  # passages
    assert np.abs(encoder.encode_short(texts) - by_torch).max() < 1e-5  # queries and sentences
    assert np.allclose(encoder.encode_query(texts[0]), by_torch[0], atol=1e-5)


def test_a_bare_name_is_float32_and_one_encoder_with_its_spelled_out_name():
    assert encoder_name("all-MiniLM-L6-v2") == "all-MiniLM-L6-v2@float32"
    assert load_encoder("all-MiniLM-L6-v2") is load_encoder("all-MiniLM-L6-v2@float32")
    assert recorded_encoder("all-MiniLM-L6-v2") == "all-MiniLM-L6-v2@bfloat16"  # what indexes built before meant
    with pytest.raises(ValueError, match="unknown precision 'float16'"):
        encoder_name("all-MiniLM-L6-v2@float16")


def test_bf16_on_a_cpu_that_emulates_it_says_so(monkeypatch):
    for name, value in AVX2_ONLY.items():  # an AVX2-only machine's kernels
        monkeypatch.setenv(name, value)
    assert "not native on this CPU" in Encoder("all-MiniLM-L6-v2@bfloat16").note
    assert Encoder("all-MiniLM-L6-v2").note == ""


@pytest.mark.skipif(not cpu_flags() & BF16_CPU_FLAGS, reason="this CPU has no bf16 instructions")
def test_bf16_where_it_is_native_says_nothing(monkeypatch):
    for name in KERNEL_CAPS:
        monkeypatch.delenv(name, raising=False)
    assert Encoder("all-MiniLM-L6-v2@bfloat16").note == ""


def test_a_changed_precision_rebuilds_the_source_and_never_mixes_vectors(tmp_path):
    corpus = write_jsonl(tmp_path / "a.jsonl", ASTRONOMY)
    built = {}
    for precision in ("float32", "bfloat16", "float32"):
        ws = Workspace(Config(workspace=tmp_path / "ws", encoder=f"all-MiniLM-L6-v2@{precision}"))
        report = ws.index(SourceSpec("astronomy", "jsonl", str(corpus)))
        built.setdefault(precision, []).append(report)
        assert report.encoder.startswith(f"all-MiniLM-L6-v2@{precision} (")
        assert ws.source_health()[0][1].encoder == f"all-MiniLM-L6-v2@{precision}"
    first, bf16, back = built["float32"][0], built["bfloat16"][0], built["float32"][1]
    assert first.status == bf16.status == back.status == "built"
    assert bf16.embedded_now == len(ASTRONOMY) and any("encoder changed from all-MiniLM-L6-v2@float32 to "
                                                       "all-MiniLM-L6-v2@bfloat16" in note for note in bf16.notes)
    assert back.embedded_now == 0  # float32's vectors were kept under their own name, not overwritten by bf16's
    cache = EmbeddingCache(tmp_path / "ws" / "cache" / "embeddings.sqlite", load_encoder("all-MiniLM-L6-v2"))
    names = {name for (name,) in cache._db.execute("SELECT DISTINCT encoder FROM vectors")}
    assert names == {"all-MiniLM-L6-v2@float32", "all-MiniLM-L6-v2@bfloat16"}


def test_query_time_vectors_are_held_in_memory_bounded_and_never_written_to_disk(tmp_path):
    """M5: an engine's or a remote's candidates were embedded and stored on disk forever (438 KB a request at depth
    200). Queries' vectors are now held in memory, at most `query_time_vectors`; builds' still go to disk."""
    path = tmp_path / "cache" / "embeddings.sqlite"
    cache = EmbeddingCache(path, load_encoder("all-MiniLM-L6-v2"), query_time_vectors=5)
    indexed = "Mars has two small moons, Phobos and Deimos."
    cache.embed([indexed])  # what a build does
    texts = [f"Candidate passage number {i} from an engine." for i in range(8)]
    first = cache.embed(texts, keep=False)
    assert cache.last_computed == 8 and cache.held == 5
    assert cache._db.execute("SELECT COUNT(*) FROM vectors").fetchone() == (1,)  # only the build's
    again = cache.embed(texts[3:] + [indexed], keep=False)  # the last five are held, the indexed one is on disk
    assert cache.last_computed == 0 and np.array_equal(again[:5], first[3:])
    cache.embed(texts[:1], keep=False)  # dropped by the bound: computed again
    assert cache.last_computed == 1 and cache.held == 5


def test_a_long_query_time_embedding_lets_a_concurrent_short_one_through_between_its_turns(tmp_path):
    """M5: one request embedding hundreds of new candidates held the cache for all of them (a concurrent search
    took 4.7 s). Vectors are computed in turns taken in order, so the short request waits for one turn only."""
    import threading

    encoder = load_encoder("all-MiniLM-L6-v2")
    cache = EmbeddingCache(tmp_path / "cache" / "embeddings.sqlite", encoder)
    words = "storm pressure rings ice moon orbit dust crater basalt plume".split()
    long_texts = [" ".join(words[(i + j) % 10] + str(i) for j in range(150)) for i in range(96)]  # 3 turns
    started, finished = threading.Event(), []
    real_encode = encoder.encode

    def encode(texts, **options):  # the real encoder, watched: the long request has begun its turns
        started.set()
        return real_encode(texts, **options)

    encoder.encode = encode
    try:
        long = threading.Thread(target=lambda: (cache.embed(long_texts, keep=False), finished.append("long")))
        long.start()
        assert started.wait(60)
        cache.embed(["Which planet has rings of ice?"], keep=False)
        finished.append("short")
        long.join()
    finally:
        del encoder.encode
    assert finished == ["short", "long"]
