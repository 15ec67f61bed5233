"""What a folder's sync costs when a few files change, at 1,000 and 10,000 files: does it grow with the change or
with the folder?

The folders: MS MARCO passages (TREC DL19's corpus in ../shared/data), one file each, 100 files a subfolder. Each is
indexed once (its vectors then stay in the bench workspace's embedding cache, so a later run builds it fast); then,
in the same process (as `gradfuse watch` and `serve --watch` run: the encoder loaded, the file parser's
worker kept), each row changes the folder
and times the sync that publishes it (`Workspace.index`): nothing changed; 10 files touched (their times move,
their bytes do not); 10 edited (another passage appended); 10 added; 10 deleted; 10 of each at once. Each row is
repeated with other files (`--repeats`, median and max reported) and says what the sync listed, read again,
embedded and dropped. The first sync after the build is its own row: the files were written within 2 s of the
build's look at them, so their stat is not trusted yet and each is hashed once more (indexing/file_stamps.py).
The last row runs the 30-change sync as the command line does it (a new process, the encoder
loaded cold): `gradfuse build`. Then a `gradfuse serve --watch` on the folder: seconds from a save to the first
answer that holds it, and from a deletion to the first that no longer cites the file.

Run: make bench-sync (results/sync/).
"""

from __future__ import annotations

import argparse
import json

import httpx
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "trec_dl19_passage" / "corpus.jsonl"
WORK = ROOT / ".gradfuse" / "bench" / "sync"
CHANGED = 10
TARGET_S = 2.0  # the target: 10 changed files in a 10,000-file folder synced and published

sys.path.insert(0, str(ROOT / "tests"))
from live_server import gradfuse_serve  # noqa: E402  (the tests' helper)

from gradfuse import SourceSpec, Workspace  # noqa: E402
from gradfuse.config import Config  # noqa: E402
from gradfuse.eval.record import ResultsFile  # noqa: E402
from gradfuse.ingest.readers.isolation import parser_kept  # noqa: E402


def passages() -> list[dict]:
    with open(CORPUS) as handle:
        return [json.loads(line) for line in handle]


def file_of(folder: Path, number: int) -> Path:
    return folder / f"part-{number // 100:03d}" / f"passage-{number:05d}.txt"


def make_folder(folder: Path, texts: list[dict], count: int) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    for number in range(count):
        path = file_of(folder, number)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[number]["text"])


class Folder:
    """The folder as the rows change it: which numbers exist, and the spare passages new files are made from."""

    def __init__(self, folder: Path, texts: list[dict], count: int):
        self.folder, self.texts, self.present = folder, texts, list(range(count))
        self.spare = count  # the next passage (past the folder's) a new file or an edit takes its text from

    def _take(self) -> str:
        text = self.texts[self.spare]["text"]
        self.spare += 1
        return text

    def touch(self, start: int) -> None:
        for number in self.present[start : start + CHANGED]:
            os.utime(file_of(self.folder, number))

    def edit(self, start: int) -> None:
        for number in self.present[start : start + CHANGED]:
            with open(file_of(self.folder, number), "a") as handle:
                handle.write("\n\n" + self._take())

    def add(self, start: int) -> None:
        for _ in range(CHANGED):
            number = max(self.present) + 1
            path = file_of(self.folder, number)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self._take())
            self.present.append(number)

    def delete(self, start: int) -> None:
        for number in self.present[start : start + CHANGED]:
            file_of(self.folder, number).unlink()
        del self.present[start : start + CHANGED]

    def all_three(self, start: int) -> None:
        self.edit(start)
        self.add(start)
        self.delete(start + 5 * CHANGED)


def timed_sync(workspace: Workspace, spec: SourceSpec) -> dict:
    started = time.perf_counter()
    report = workspace.index(spec)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "status": report.status, "embedded": report.embedded_now, **report.files}


def top_files(url: str, text: str) -> list[str]:
    """The files of the 10 passages the server ranks first for `text` (MS MARCO repeats some passages almost
    word for word: the file that holds one need not be first)."""
    found = httpx.post(url + "/search", json={"query": " ".join(text.split()[:16]), "method": "rrf", "k": 10,
                                              "retrieval": "bm25"}, timeout=60).json()["candidates"]
    return [candidate["doc_id"].split("#")[0] for candidate in found]


def seconds_until(check) -> float:
    started = time.perf_counter()
    while not check():
        if time.perf_counter() - started > 120:
            raise RuntimeError("the watched server did not publish the change within 120 s")
        time.sleep(0.05)
    return time.perf_counter() - started


def watched_server(base: Path, folder: Folder, repeats: int) -> dict:
    """Seconds from a save to the first answer that holds it (the file among the top 10 for the text it gained),
    and from a deletion to the first answer that no longer cites the file (not among the top 10 for its text),
    from `gradfuse serve --watch` (its defaults: 0.5 s debounce)."""
    saved, deleted = [], []
    with gradfuse_serve(base / "ws", "--watch", env={"GRADFUSE_API_KEY": ""}) as url:
        time.sleep(5)  # its first sync of the folder
        for repeat in range(repeats):
            number = folder.present[500 + repeat * 13]
            path = file_of(folder.folder, number)
            relative = path.relative_to(folder.folder).as_posix()
            text = folder._take()
            with open(path, "a") as handle:
                handle.write("\n\n" + text)
            saved.append(seconds_until(lambda: relative in top_files(url, text)))
            kept = path.read_text()
            path.unlink()
            folder.present.remove(number)
            deleted.append(seconds_until(lambda: relative not in top_files(url, kept)))
            time.sleep(1)
    return {"saved_median_s": round(statistics.median(saved), 2), "saved_max_s": round(max(saved), 2),
            "deleted_median_s": round(statistics.median(deleted), 2), "deleted_max_s": round(max(deleted), 2),
            "saved_s": [round(s, 2) for s in saved], "deleted_s": [round(s, 2) for s in deleted]}


def row_of(runs: list[dict]) -> dict:
    seconds = [run["seconds"] for run in runs]
    last = runs[-1]
    return {"median_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3), "runs": len(runs),
            "status": last["status"], "listed": last["listed"],
            "hashed": statistics.median(run["hashed"] for run in runs),
            "read": statistics.median(run["read"] for run in runs),
            "embedded": statistics.median(run["embedded"] for run in runs),
            "dropped": statistics.median(run["changed"] + run["deleted"] for run in runs),
            "seconds": [round(s, 3) for s in seconds]}


def cold_cli(config: Path) -> dict:
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "gradfuse"), "build", "--config", str(config)],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return {"seconds": round(time.perf_counter() - started, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "sync")
    args = parser.parse_args()
    texts = passages()
    results = ResultsFile.start(args.out, "make bench-sync", corpus="trec_dl19_passage (MS MARCO passages)",
                                changed_per_row=CHANGED, repeats=args.repeats, target_s=TARGET_S)
    steps = [("unchanged", None), ("touched", "touch"), ("edited", "edit"), ("added", "add"),
             ("deleted", "delete"), ("edited+added+deleted", "all_three")]
    for size in args.sizes:
        base = WORK / f"files-{size}"
        make_folder(base / "folder", texts, size)
        config = base / "gradfuse.toml"
        config.write_text(f'workspace = "{base / "ws"}"\n\n[sources.notes]\nkind = "files"\n'
                          f'path = "{base / "folder"}"\n')
        shutil.rmtree(base / "ws", ignore_errors=True)  # the embedding cache too: every edit's text is new to it
        spec = SourceSpec("notes", "files", str(base / "folder"))
        folder = Folder(base / "folder", texts, size)
        with Workspace(Config(workspace=base / "ws")) as workspace, parser_kept():
            first = timed_sync(workspace, spec)
            results.add(f"{size} files: first build", {"median_s": round(first["seconds"], 3), **first})
            time.sleep(2.5)  # past the racy window (indexing/file_stamps.py)
            again = timed_sync(workspace, spec)  # every file was written within 2 s of the build's look
            results.add(f"{size} files: the sync after it (every file hashed again)",
                        {"median_s": round(again["seconds"], 3), **again})
            time.sleep(2.5)
            for name, change in steps:
                runs = []
                for repeat in range(args.repeats):
                    if change is not None:
                        getattr(folder, change)(repeat * 7 * CHANGED)
                    runs.append(timed_sync(workspace, spec))
                    time.sleep(2.5)
                results.add(f"{size} files: {name}", row_of(runs))
                print(size, name, results.rows[f"{size} files: {name}"], flush=True)
        folder.all_three(10 * 7 * CHANGED)
        results.add(f"{size} files: edited+added+deleted, `gradfuse build` (new process)", cold_cli(config))
        served = watched_server(base, folder, args.repeats)
        results.add(f"{size} files: `gradfuse serve --watch`", served)
        print(size, "served", served, flush=True)
    results.finish(markdown=markdown(results))


def markdown(results: ResultsFile) -> str:
    lines = [
        "# A folder's sync: cost with the change, not with the folder", "",
        results.provenance, "",
        f"Folders of MS MARCO passages, one file each; each row changes {CHANGED} files (or 10 of each kind at "
        "once) and times the sync that publishes the change, in a process that has the encoder loaded (as "
        f"`gradfuse watch` does), {results.header['repeats']} times with other files. Hashed: files opened for "
        "their hash alone (their stat moved, their bytes did not); read: files parsed again; embedded: passages "
        "whose vectors were computed (the rest came from the cache); dropped: "
        "files whose passages left the index.", "",
        "| folder, change | median s | max s | files listed | hashed | read | embedded | dropped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    served = []
    for name, row in results.rows.items():
        if "saved_s" in row:
            served.append(f"| {name.split(':')[0]} | {row['saved_median_s']:.2f} | {row['saved_max_s']:.2f} | "
                          f"{row['deleted_median_s']:.2f} | {row['deleted_max_s']:.2f} |")
        elif "listed" not in row:
            lines.append(f"| {name} | {row['seconds']:.2f} | | | | | | |")
        else:
            lines.append(f"| {name} | {row['median_s']:.3f} | {row.get('max_s', row['median_s']):.3f} | "
                         f"{row['listed']} | {row['hashed']:g} | {row['read']:g} | {row['embedded']:g} | "
                         f"{row.get('dropped', 0):g} |")
    lines += ["", "`gradfuse serve --watch` on the same folder: seconds from a save (another passage appended to a "
              "file) to the first `/search` for that passage's words whose top 10 hold the file, and from a "
              "deletion to "
              "the first whose top 10 for the file's text no longer do (polled every 50 ms).", "",
              "| folder | save → answered, median s | max s | delete → uncited, median s | max s |",
              "|---|---:|---:|---:|---:|", *served]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
