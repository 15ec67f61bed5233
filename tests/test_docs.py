"""The documentation site builds with MkDocs in strict mode: every link and every page the nav names resolves, and
the results pages come from the committed results/ folder."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_documentation_site_builds_strictly_with_the_results_pages(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    built = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                           capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert (tmp_path / "site" / "results" / "answers" / "results" / "index.html").is_file()
    assert not (tmp_path / "site" / "hooks.py").exists()
