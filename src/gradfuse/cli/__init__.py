"""`gradfuse`: a thin shell over `gradfuse.Workspace`, one module per group of commands (common.py: what they
share). Each module registers its commands on `app` when imported, in the order `gradfuse --help` lists them."""

from gradfuse.cli import building, watching, asking, serving, evaluating, access  # noqa: F401, I001
from gradfuse.cli.common import app

__all__ = ["app"]
