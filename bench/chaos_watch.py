"""The chaos bench's watched-folder row (bench/chaos.py, `--rows watch`): one `gradfuse serve --watch` over a folder
source whose `hr/` files only the hr group may read, while a churn thread adds, edits and deletes files in `public/`
and `hr/` four times a second, and three clients ask: two with a key limited to what is not hr's (`eng`), one with
the owner's key. Every passage of an hr file holds the word `secret<n>`, every passage of any file the word
`file<n>` of its own, and the questions ask for both, for files that exist, for restricted ones and for deleted ones.

Counted per key: requests, those answered 200 (none may be lost), p50 and p99; for the limited key, passages of an
hr file returned (must be 0); for both, passages of a file deleted at least `STALE_S` seconds before the request
was sent (changes that never pause are published every 5 s, each sync taking a second or less here:
results/sync) and, for what it is worth, those of a file deleted less than that before (the sync's window).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from live_server import gradfuse_serve

KEYS = {"owner": "owner-watch-key", "limited": "limited-watch-key"}
STEP_S = 0.25  # the churn's pace: one change a step
# A deleted file returned later than this after its deletion counts against the server: under changes that never
# pause a watcher syncs every 5 s (indexing/watch.LONGEST_WAIT_S), and a sync of this folder takes well under 5 s.
STALE_S = 10.0
WORDS = "quarterly budget review for the platform team covers hiring travel and hardware".split()


class Churn:
    """Files added, edited and deleted at random (seeded) in `public/` and `hr/`; what was deleted and when."""

    def __init__(self, folder: Path, seed: int = 5):
        self.folder, self._rng, self._next = folder, random.Random(seed), 0
        self.alive: dict[str, str] = {}  # file: its marker word
        self.deleted: dict[str, float] = {}  # file: when it was deleted (time.time())
        self._lock = threading.Lock()
        for n in range(30):
            self._write("hr" if n % 3 == 0 else "public")

    def _write(self, part: str, name: str | None = None) -> None:
        if name is None:
            name, self._next = f"{part}/file{self._next}.md", self._next + 1
        marker = name.split("/")[1].removesuffix(".md")
        secret = f" secret{marker.removeprefix('file')}" if part == "hr" else ""
        words = " ".join(self._rng.sample(WORDS, 6))
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {marker}\n\nThe {words} {marker}{secret}, edited {time.time():.3f}.\n")
        with self._lock:
            self.alive[name] = marker
            self.deleted.pop(name, None)

    def step(self) -> None:
        part = self._rng.choice(["hr", "public"])
        with self._lock:
            mine = sorted(name for name in self.alive if name.startswith(part + "/"))
        action = self._rng.choice(["add", "edit", "delete"]) if len(mine) > 3 else "add"
        if action == "add":
            self._write(part)
        elif action == "edit":
            self._write(part, self._rng.choice(mine))
        else:
            name = self._rng.choice(mine)
            with self._lock:
                del self.alive[name]
                self.deleted[name] = time.time()
            (self.folder / name).unlink()

    def question(self, rng: random.Random) -> str:
        with self._lock:
            pool = list(self.alive) + list(self.deleted)
        name = rng.choice(pool)
        number = name.split("/file")[1].removesuffix(".md")
        return f"quarterly budget review file{number} secret{number}"

    def deleted_at(self, name: str) -> float | None:
        with self._lock:
            return self.deleted.get(name)


def config(folder: Path, notes: Path) -> Path:
    lines = ['workspace = "ws"', "[server]", "cache_mb = 0", "[sources.notes]", 'kind = "files"',
             f'path = "{notes}"', "[sources.notes.readers]", '"hr/*" = ["hr"]',
             "[access.principals.owner]", f'key_sha256 = "{_sha(KEYS["owner"])}"', 'sources = ["*"]',
             "every_document = true",
             "[access.principals.limited]", f'key_sha256 = "{_sha(KEYS["limited"])}"', 'sources = ["*"]',
             'groups = ["eng"]']
    path = folder / "watched.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def watch_row(folder: Path, seconds: float) -> dict:
    notes = folder / "watched-notes"
    churn = Churn(notes)
    with gradfuse_serve(folder / "watched-ws", "--config", str(config(folder, notes)), "--watch",
                        log=folder / "watched.log") as url:
        _wait_for_first_build(url)
        stop = threading.Event()
        logs: dict[str, list] = {"owner": [], "limited": []}
        threads = [threading.Thread(target=_ask, args=(url, who, churn, stop, logs[who], n))
                   for n, who in enumerate(["limited", "limited", "owner"])]
        for thread in threads:
            thread.start()
        started, steps = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            churn.step()
            steps += 1
            time.sleep(STEP_S)
        stop.set()
        for thread in threads:
            thread.join()
    row = {"table": "watch", "changes": steps, "seconds": seconds}
    for who, log in logs.items():
        ms = np.array([r["ms"] for r in log]) if log else np.zeros(1)
        row[who] = {"requests": len(log), "answered": sum(r["status"] == 200 for r in log),
                    "p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1),
                    "restricted_returned": sum(r["restricted"] for r in log),
                    "deleted_returned_late": sum(r["late"] for r in log),
                    "deleted_returned_in_window": sum(r["window"] for r in log)}
    return row


def _wait_for_first_build(url: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        reply = httpx.get(url + "/sources", headers={"X-API-Key": KEYS["owner"]}, timeout=30)
        if reply.status_code == 200 and any(s.get("name") == "notes" for s in reply.json()):
            return
        time.sleep(0.5)
    raise RuntimeError("the watched source was not built within 300 s")


def _ask(url: str, who: str, churn: Churn, stop: threading.Event, log: list, seed: int) -> None:
    rng = random.Random(seed)
    headers = {"X-API-Key": KEYS[who]}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        while not stop.is_set():
            question, sent = churn.question(rng), time.time()
            began = time.perf_counter()
            try:
                reply = client.post("/search", json={"query": question, "k": 10})
                status = reply.status_code
                found = [c["doc_id"].split("#")[0] for c in reply.json().get("candidates", [])] if status == 200 else []
            except httpx.HTTPError as error:
                status, found = type(error).__name__, []
            ms = (time.perf_counter() - began) * 1000
            deleted = [churn.deleted_at(name) for name in found]
            log.append({"status": status, "ms": ms,
                        "restricted": sum(name.startswith("hr/") for name in found) if who == "limited" else 0,
                        "late": sum(at is not None and sent - at >= STALE_S for at in deleted),
                        "window": sum(at is not None and sent - at < STALE_S for at in deleted)})


def markdown_rows(row: dict, provenance: str) -> list[str]:
    lines = ["# Chaos: a watched folder under churn", "",
             f"{provenance} One `gradfuse serve --watch` over a folder source whose `hr/` files only the hr group reads, while "
             f"{row['changes']} changes (adds, edits, deletes in `public/` and `hr/`, one every {STEP_S:g} s) are made "
             f"over {row['seconds']:g} s; two clients with a key limited to `eng`, one with the owner's, ask for "
             "files that exist, restricted ones and deleted ones (bench/chaos_watch.py). \"Late\": passages of a file "
             f"deleted {STALE_S:g} s or more before the request; \"in the window\": less than that (the sync's).", "",
             "| key | requests | answered 200 | p50 ms | p99 ms | hr passages returned | deleted returned late | "
             "deleted returned in the window |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for who in ("limited", "owner"):
        r = row[who]
        restricted = r["restricted_returned"] if who == "limited" else "– (may read them)"
        lines.append(f"| {who} | {r['requests']} | {r['answered']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | "
                     f"{restricted} | {r['deleted_returned_late']} | {r['deleted_returned_in_window']} |")
    return lines
