"""What every results file records (gradfuse.eval.record): the commit of the package's own checkout wherever the
command runs, the CPU's class, and rows written as they finish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gradfuse.eval.record import PACKAGE, ResultsFile, commit_id, machine_description


def test_the_commit_is_the_packages_checkouts_from_any_folder(tmp_path):
    head = subprocess.run(["git", "-C", str(PACKAGE), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    elsewhere = subprocess.run([sys.executable, "-c", "from gradfuse.eval.record import commit_id; print(commit_id())"],
                               cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert elsewhere == commit_id() and elsewhere.split("+")[0] == head  # it once said "unknown" run from elsewhere
    assert elsewhere in (head, head + "+changes")


def test_the_machine_line_names_the_cpu_class_that_decides_the_lms_precision():
    line = machine_description()
    assert "cores" in line and "bf16 native: " in line and "Python " in line


def test_rows_are_on_disk_as_they_finish_and_the_end_is_marked(tmp_path):
    results = ResultsFile.start(tmp_path / "out", "make bench-x", sources=3)
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert written["finished"] is None and written["sources"] == 3 and written["rows"] == {}
    results.add("first", {"ndcg@10": 0.5})
    # a run stopped here leaves its first row
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rows"] == {"first": {"ndcg@10": 0.5}}
    results.add("second", {"ndcg@10": 0.6})
    payload = results.finish("# Results\n\n| row |", minutes=1.5)
    on_disk = json.loads((tmp_path / "out" / "results.json").read_text())
    assert on_disk == payload and on_disk["finished"] and on_disk["minutes"] == 1.5 and len(on_disk["rows"]) == 2
    assert (tmp_path / "out" / "results.md").read_text() == "# Results\n\n| row |\n"
    assert not list(Path(tmp_path / "out").glob("*.tmp"))
