"""What every results file records beside its numbers, whoever writes it (`gradfuse eval`, bench/*.py): the commit
of the code that ran, read from the package's own checkout (not from the folder the command ran in); the machine,
with the CPU's class (whether bf16 is native there decides the scoring LM's precision); the command; and the rows as
they finish, so that a run stopped half-way leaves what it measured, marked unfinished.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gradfuse.eval.stats import estimate, paired_p_value
from gradfuse.hardware import cpu_description

__all__ = ["ResultsFile", "commit_id", "estimate", "machine_description", "paired_p_value", "write_json"]

PACKAGE = Path(__file__).resolve().parents[1]


def commit_id() -> str:
    """The short commit of the checkout the package runs from, with "+changes" where its code differs from that
    commit; "not a checkout" for an installed package (whose code no commit here names)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(PACKAGE), *args], capture_output=True, text=True)

    try:
        tracked = git("ls-files", "--error-unmatch", "__init__.py").returncode == 0
        head = git("rev-parse", "--short", "HEAD")
    except OSError:  # no git on this machine
        return "unknown (no git)"
    if not tracked or head.returncode != 0:
        return "not a checkout"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".").stdout.strip()
    return head.stdout.strip() + ("+changes" if changed else "")


def machine_description() -> str:
    """The CPU (model, cores, the flags that decide the LM's precision, whether bf16 is native), torch and Python."""
    try:
        import torch
    except ImportError:
        runtime = "no torch"
    else:
        runtime = f"torch {torch.__version__} on {'cuda' if torch.cuda.is_available() else 'cpu'}"
    return f"{cpu_description()}; {runtime}; Python {platform.python_version()}"


def write_json(path: Path, payload: dict, indent: int = 1) -> None:
    """`payload` as JSON at `path`, through a temporary file: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(payload, indent=indent) + "\n")
    os.replace(partial, path)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class ResultsFile:
    """`folder`/`name`.json, written again as each row finishes; `finish` marks it complete and writes `name`.md.
    A run stopped half-way leaves the rows it finished, with `"finished": null`."""

    folder: Path
    header: dict
    rows: dict = field(default_factory=dict)
    name: str = "results"

    @classmethod
    def start(cls, folder: Path, command: str, *, name: str = "results", **settings) -> ResultsFile:
        """A results file for a run of `command` starting now; `settings`: what the run measured, and how."""
        header = {"command": command, "commit": commit_id(), "machine": machine_description(), "started": _now(),
                  "finished": None, **settings}
        results = cls(Path(folder), header, name=name)
        results._write()
        return results

    @property
    def provenance(self) -> str:
        """The line a results page opens with: the command, the code and the machine."""
        return f"Made by `{self.header['command']}` · commit {self.header['commit']} · {self.header['machine']}."

    def add(self, name: str, row: dict) -> None:
        self.rows[name] = row
        self._write()

    def finish(self, markdown: str | None = None, **totals) -> dict:
        """Mark the run complete (with `totals`, what is known only at its end) and write `markdown` as results.md."""
        self.header.update(totals, finished=_now())
        self._write()
        if markdown is not None:
            (self.folder / f"{self.name}.md").write_text(markdown.rstrip() + "\n")
        return self.payload

    @property
    def payload(self) -> dict:
        return {**self.header, "rows": self.rows}

    def _write(self) -> None:
        write_json(self.folder / f"{self.name}.json", self.payload)
