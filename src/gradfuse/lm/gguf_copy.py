"""The de-quantised copy of a GGUF file, made once in a child process and kept on disk.

transformers takes about 28 CPU-seconds to de-quantise SmolLM2's GGUF here (it parses the file three times, in
Python) and about a second to open the saved safetensors. Made in this process, that Python held the GIL and the
one model-loading lock, so the demo's builds waited for it (measured by hand here: 56 s for the demo from an empty
cache, against 29 s for its builds alone; 31.5 s now, results/indexing); made in a child, it takes a core of its
own. Where the copy cannot be kept (a read-only cache) or the child fails, the caller de-quantises in its own
process as before, and the log says why once.

    python -m gradfuse.lm.gguf_copy FILE.gguf
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from gradfuse.loading import check_materialised, user_cache
from gradfuse.redact import redact

log = logging.getLogger(__name__)
_converting: dict[Path, threading.Lock] = {}
_guard = threading.Lock()


def converted_folder(path: Path) -> Path:
    """Where the de-quantised copy of a GGUF file is kept: keyed by the file's name, size and modification time;
    GRADFUSE_CACHE (default ~/.cache/gradfuse) sets the folder."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return user_cache() / "models" / f"{path.stem}-{key}"


# What the child needs of the environment: where the cache is, the offline switches, locale and temporary files.
# Nothing else (keys and database URLs included) is passed.
_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "GRADFUSE_CACHE", "HF_HOME",
                "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS")
CHILD_TIMEOUT_S = 3600  # SmolLM2 takes half a minute; a model of several billion parameters, many minutes
_failed: set[Path] = set()  # files this process could not convert in a child: not tried again per request


def ensure_converted(path: Path) -> Path | None:
    """The saved copy's folder, converting in a child process first if there is none; None where it cannot be
    made (a cache that cannot be written, a failed or timed-out child: said once in the log). Threads asking for
    the same file wait for one conversion."""
    folder = converted_folder(path)
    if (folder / "config.json").is_file():
        return folder
    key = path.resolve()
    with _guard:
        lock = _converting.setdefault(key, threading.Lock())
    with lock:
        if key not in _failed and not (folder / "config.json").is_file():
            why = _unwritable(folder.parent) or _convert_in_child(path)
            if why and not (folder / "config.json").is_file():  # another process may have won the race
                _failed.add(key)
                log.warning("the GGUF file %s is de-quantised in this process instead of a child: %s", path.name,
                            redact(why))
    return folder if (folder / "config.json").is_file() else None


def _unwritable(cache: Path) -> str:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            return ""
    except OSError as error:
        return f"its copy cannot be kept in {cache} ({error.strerror or error})"


def _convert_in_child(path: Path) -> str:
    """'' once the child saved the copy; else why not."""
    env = {name: os.environ[name] for name in _ENVIRONMENT if name in os.environ} | {"HF_HUB_OFFLINE": "1"}
    try:  # -I: the working folder (which may hold a `gradfuse/` of its own) is not on the child's path
        done = subprocess.run([sys.executable, "-I", "-m", "gradfuse.lm.gguf_copy", str(path)],
                              capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the conversion took over {CHILD_TIMEOUT_S} s"
    return "" if done.returncode == 0 else f"the conversion failed: {done.stderr.strip()[-600:]}"


def dequantise(path: Path):
    """(tokenizer, model) read from the GGUF file by transformers, in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    quiet = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its load report flags the tied lm_head as missing, repaired below
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    finally:
        transformers_logging.set_verbosity(quiet)
    # Once sentence-transformers has been imported in the process, the GGUF loader reports the tied lm_head as
    # missing and leaves it on the meta device (seen with transformers 5.24); tying again restores it.
    return tokenizer, check_materialised(model, str(path))


def save(path: Path, tokenizer, model) -> None:
    """The de-quantised model where `converted_folder` says, published whole (a crash mid-save leaves no half copy
    in use); OSError where the cache cannot be written."""
    folder = converted_folder(path)
    staging = folder.with_name(f"{folder.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    # The weights are plain float32 tensors once loaded; the GGUF marker only stops save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only left where the save or the publish failed


def main(argv: list[str]) -> None:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    path = Path(argv[0])
    save(path, *dequantise(path))


if __name__ == "__main__":
    main(sys.argv[1:])
