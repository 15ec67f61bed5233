"""MkDocs hook: every file of the committed results/ folder (the benchmarks' tables and plots, as `make bench-*`
wrote them) is a page or an image of the site at the same path, so the site shows the numbers as they are, never a
copy that can go stale."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[1] / "results"


def on_files(files: Files, config) -> Files:
    for path in sorted(RESULTS.rglob("*")):
        if path.suffix in (".md", ".png"):
            files.append(File.generated(config, f"results/{path.relative_to(RESULTS).as_posix()}",
                                        abs_src_path=str(path)))
    return files
