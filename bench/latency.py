"""How long a user waits, before and after this round's work on it (issue 70: the evidence step; issue 71: what a
command imports), on this machine.

Each step runs twice: with the code of BASELINE (main before that work) and with the code checked out now, each
over a workspace of the demo's four sources that it built itself.
`--kernels avx2` runs every process with an AVX2-only machine's kernels (gradfuse.hardware.AVX2_ONLY); each class
keeps its own section of the results; `--cold-only` measures the cold commands and the server start again beside the
stored warm rows. Measured:

- a cold CLI: `gradfuse --help`, `sources`, `search` and `ask` with the default method, each in a new process;
- `gradfuse serve` (without --preload-lm) until /healthz answers;
- a warm server (--preload-lm): /search and /ask for rrf, select, gro (UPR, its default signal) and gro with the
  gradient, on questions it has not seen (the warm-up question aside), and a repeated question;
- the same server over documents nobody here wrote (bench-reading's workspace of six Debian documentation families,
  one built by today's code for both: the index did not change): /search and /ask with the defaults, REAL questions
  of the reading benchmark that it has not seen (the evidence step was 177 ms of a 198 ms /ask there);
- how far the change moves what is ranked (now against the baseline), and the query vector of the ONNX copy
  against sentence-transformers'.

Wall time p50/p90 over the questions, and CPU-seconds (user + system) of the process that did the work. Writes
results/latency/results.md and results.json. Run alone: two busy cores make every number larger.

    python bench/latency.py [--repeats 5] [--kernels native|avx2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from scipy.stats import spearmanr

from gradfuse.config import Config
from gradfuse.eval.record import ResultsFile
from gradfuse.hardware import AVX2_ONLY

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reading  # noqa: E402  (bench/reading.py: its documents and questions)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "latency"
WORKSPACES = ROOT / ".gradfuse" / "bench" / "latency"  # one workspace per code, each built by that code
BASELINE = "360c39f"  # main before issue 70's evidence step and issue 71's imports
GRADFUSE = Path(sys.executable).with_name("gradfuse")
WARM_UP = "What does the json module do?"
# Issue 71's targets for a cold command on two cores (wall seconds, p50).
COLD_TARGETS = {"gradfuse --help": 0.15, "gradfuse search (select)": 0.4, "gradfuse ask (select)": 0.6}
QUESTIONS = [  # questions the demo's sources answer, none asked twice (each embeds and ranks from scratch)
    "How do I turn a Python dictionary into a JSON string?",
    'What happens when the body of a "with" statement raises an exception?',
    "How can I read a CSV file row by row?",
    "How do I run a shell command and capture its output?",
    "What does functools.lru_cache do?",
    "How do I copy a whole directory tree?",
    "How do I compute the median of a list of numbers?",
    "What happens in gradfuse when one source times out?",
]
REAL = 20  # reading-benchmark questions asked of the server over its documents
METHODS = {"rrf": {"method": "rrf"}, "select": {"method": "select"}, "gro": {"method": "gro"},
           "gro (gradient)": {"method": "gro", "scorer": "gradient"}}


def percentiles(values: list[float]) -> dict:
    return {"p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)), "n": len(values)}


@contextmanager
def code_of(commit: str | None):
    """An environment whose `gradfuse` runs `commit`'s code (a temporary checkout first on PYTHONPATH), or the code
    checked out now (None)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GRADFUSE_API_KEY": "",
           "BENCH_WORKSPACE": str(WORKSPACES / (commit or "now"))}
    if commit is None:
        yield env
        return
    folder = Path(tempfile.mkdtemp(prefix="gradfuse-baseline-"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
        yield {**env, "PYTHONPATH": str(folder / "src")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def timed_command(args: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one command, which must succeed."""
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = os.times()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def cold_cli(env: dict, repeats: int) -> dict:
    ws = ["--workspace", env["BENCH_WORKSPACE"]]
    commands = {
        "gradfuse --help": ["--help"],
        "gradfuse sources": ["sources", *ws],
        "gradfuse search (select)": ["search", QUESTIONS[0], *ws],
        "gradfuse ask (select)": ["ask", QUESTIONS[0], *ws],
    }
    rows = {}
    bare = [timed_command([sys.executable, "-c", "pass"], env) for _ in range(repeats)]
    rows["python -c pass"] = {"wall": percentiles([w for w, _ in bare]), "cpu": percentiles([c for _, c in bare])}
    for name, args in commands.items():
        runs = [timed_command([str(GRADFUSE), *args], env) for _ in range(repeats)]
        rows[name] = {"wall": percentiles([w for w, _ in runs]), "cpu": percentiles([c for _, c in runs])}
        print(name, rows[name]["wall"], flush=True)
    return rows


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@contextmanager
def server(env: dict, *extra: str):
    """`gradfuse serve` on a free port; yields (url, process, seconds until /healthz answered)."""
    port = free_port()
    started = time.perf_counter()
    process = subprocess.Popen([str(GRADFUSE), "serve", "--port", str(port), "--workspace", env["BENCH_WORKSPACE"],
                                "--log-level", "warning", *extra], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        yield url, process, time.perf_counter() - started
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def server_start(env: dict, repeats: int) -> dict:
    walls, cpus = [], []
    for _ in range(repeats):
        with server(env) as (_, process, seconds):
            walls.append(seconds)
            cpus.append(process_cpu(process.pid))
    print("server start", percentiles(walls), flush=True)
    return {"wall": percentiles(walls), "cpu": percentiles(cpus)}


def request(url: str, pid: int, path: str, body: dict, client=httpx) -> tuple[float, float, dict, dict]:
    """One request on a new connection, or on `client`'s kept-alive one."""
    before, started = process_cpu(pid), time.perf_counter()
    response = client.post(url + path, json=body, timeout=600)
    wall = time.perf_counter() - started
    response.raise_for_status()
    return wall, process_cpu(pid) - before, response.json(), dict(response.headers)


def warm_server(env: dict, questions: list[str]) -> tuple[dict, dict]:
    """Rows per endpoint and method, and gro's rankings per question (for the agreement of the two codes)."""
    rows, rankings = {}, {}
    with server(env, "--preload-lm") as (url, process, _):
        for path in ("/search", "/ask"):
            for name, options in METHODS.items():
                request(url, process.pid, path, {"query": WARM_UP, **options})  # first use: nothing to load later
                runs = [request(url, process.pid, path, {"query": q, **options}) for q in questions]
                rows[f"{path} {name}"] = {"wall": percentiles([r[0] for r in runs]),
                                          "cpu": percentiles([r[1] for r in runs])}
                if path == "/search":
                    rankings[name] = [[(c["source"], c["doc_id"]) for c in r[2]["candidates"]] for r in runs]
                if path == "/ask":
                    rows[f"{path} {name}"]["evidence"] = percentiles([r[2]["timings"].get("evidence", 0.0)
                                                                      for r in runs])
                print(path, name, rows[f"{path} {name}"]["wall"], flush=True)
        repeat = {"query": questions[0], "method": "select"}
        with httpx.Client() as kept_alive:  # what a page or an SDK does: one connection for many requests
            for row, client in (("/ask repeated question", httpx), ("/ask repeated question, kept-alive", kept_alive)):
                repeated = [request(url, process.pid, "/ask", repeat, client) for _ in range(8)]
                rows[row] = {"wall": percentiles([r[0] for r in repeated[1:]]),
                             "cpu": percentiles([r[1] for r in repeated[1:]]),
                             "cached": all(r[3].get("x-gradfuse-cache") == "hit" for r in repeated[1:])}
    return rows, rankings


def reading_questions() -> tuple[str, list[str]]:
    """A warm-up question and REAL others of the reading benchmark, spread over its families."""
    asked = [json.loads(line)["question"] for line in (ROOT / "benchmarks" / "reading" / "questions.jsonl")
             .read_text().splitlines() if line.strip()]
    step = len(asked) // (REAL + 1)
    return asked[0], asked[step::step][:REAL]


def real_documents(env: dict) -> dict:
    """Rows of warm /search and /ask over the reading benchmark's workspace, questions it has not seen."""
    warm_up, questions = reading_questions()
    rows = {}
    with server({**env, "BENCH_WORKSPACE": str(reading.WORKSPACE)}, "--preload-lm") as (url, process, _):
        for path in ("/search", "/ask"):
            request(url, process.pid, path, {"query": warm_up})
            runs = [request(url, process.pid, path, {"query": q}) for q in questions]
            name = f"{path} real documents"
            rows[name] = {"wall": percentiles([r[0] for r in runs]), "cpu": percentiles([r[1] for r in runs])}
            if path == "/ask":
                rows[name]["evidence"] = percentiles([r[2]["timings"].get("evidence", 0.0) for r in runs])
            print(path, "real documents", rows[name]["wall"], flush=True)
    return rows


def agreement(before: list[list], after: list[list]) -> dict:
    """How the order of gro's candidates moved: Spearman over the candidates both returned, same first."""
    rhos, firsts = [], []
    for a, b in zip(before, after):
        shared = [c for c in a if c in b]
        if len(shared) >= 2:
            rhos.append(spearmanr([a.index(c) for c in shared], [b.index(c) for c in shared]).statistic)
        firsts.append(bool(a and b and a[0] == b[0]))
    return {"spearman_mean": float(np.mean(rhos)), "spearman_min": float(np.min(rhos)),
            "same_first": float(np.mean(firsts)), "questions": len(firsts)}


def query_vectors() -> dict:
    """The ONNX copy's query vectors against sentence-transformers' (float32, and bf16: the passages' precision
    before issue 38)."""
    from gradfuse.embedding.encoder import Encoder

    onnx = Encoder("all-MiniLM-L6-v2@float32")
    torch32 = onnx._passage_model().encode(QUESTIONS, normalize_embeddings=True, convert_to_numpy=True)
    bf16 = Encoder("all-MiniLM-L6-v2@bfloat16").encode(QUESTIONS)
    vectors = onnx.encode_short(QUESTIONS)
    return {"max_abs_vs_float32": float(np.abs(vectors - torch32).max()),
            "min_cosine_vs_bfloat16": float((vectors * bf16).sum(axis=1).min())}


BUILD = """
import os, sys
from pathlib import Path
from gradfuse import Workspace
from gradfuse.config import Config
from gradfuse.demo import demo_specs
workspace = Path(os.environ["BENCH_WORKSPACE"])
ws = Workspace(Config(workspace=workspace))
for spec in demo_specs(workspace / "inputs"):
    ws.index(spec)
"""


def build_workspace(env: dict) -> None:
    """The demo's four sources, built by the code `env` runs (so each code reads an index it made)."""
    done = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"building the workspace failed: {done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each cold command and server start")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="warm questions (fewer: a smoke test)")
    parser.add_argument("--kernels", choices=("native", "avx2"), default="native",
                        help="avx2: an AVX2-only machine's kernels (gradfuse.hardware.AVX2_ONLY) in every process")
    parser.add_argument("--cold-only", action="store_true",
                        help="measure the cold commands and the server start again, keep the stored warm rows")
    args = parser.parse_args()
    questions = QUESTIONS[: args.questions]
    if args.kernels == "avx2":
        os.environ.update(AVX2_ONLY)
    kept = stored_rows(args.kernels, args.cold_only)
    command = " ".join(["python bench/latency.py", *sys.argv[1:]])
    results = ResultsFile.start(OUT, command, name="results")
    for name, row in kept.items():
        results.add(name, row)
    header = results.header
    results.add(f"{args.kernels} {'cold run' if args.cold_only else 'run'}", {
        "command": command, "commit": header["commit"], "machine": header["machine"], "baseline": BASELINE,
        "questions": len(questions)})
    rankings = {}
    if not args.cold_only:
        reading.built(Config(workspace=reading.WORKSPACE))
    for label, code in (("before", BASELINE), ("after", None)):
        with code_of(code) as env:
            build_workspace(env)
            if not args.cold_only:
                warm, rankings[label] = warm_server(env, questions)
                warm.update(real_documents(env))
                results.add(f"{args.kernels} {label} warm", warm)
            results.add(f"{args.kernels} {label} cold", cold_cli(env, args.repeats))
            results.add(f"{args.kernels} {label} server start", server_start(env, max(3, args.repeats // 2)))
    if not args.cold_only:
        results.add(f"{args.kernels} agreement", {name: agreement(rankings["before"][name], rankings["after"][name])
                                                  for name in ("gro", "gro (gradient)", "select")})
        results.add(f"{args.kernels} query vectors", query_vectors())
    results.finish(report(results))


def stored_rows(kernels: str, cold_only: bool) -> dict:
    """The stored rows kept: the other CPU class's (each class is measured by its own run), and with `cold_only`
    this class's warm ones, beside which the cold rows are measured again."""
    stored = OUT / "results.json"
    rows = json.loads(stored.read_text()).get("rows", {}) if stored.is_file() else {}
    remeasured = ("cold", "server start", "cold run") if cold_only else ("",)
    return {name: row for name, row in rows.items()
            if not (name.startswith(f"{kernels} ") and name.endswith(remeasured))}


KERNELS = {"native": "the CPU's own kernels", "avx2": "an AVX2-only machine's kernels (ATEN_CPU_CAPABILITY=avx2, "
           "ONEDNN_MAX_CPU_ISA=AVX2; ONNX Runtime has no such switch and keeps the CPU's own)"}


def report(results: ResultsFile) -> str:
    lines = [
        "# Latency on two cores: before and after issues 70 and 71, on both CPU classes",
        "",
        "Wall seconds p50 / p90 · CPU-seconds p50 of the process that did the work. Cold: a new process per "
        "command, over the demo's four sources (each code over a workspace it built itself). Warm: a server "
        "started with --preload-lm, each method first asked once, then questions it has not seen; *real "
        f"documents*: the defaults over bench-reading's six Debian documentation families, {REAL} of its "
        "questions. *before*: main before issue 70's evidence step and issue 71's imports; *after*: today's code.",
        "",
    ]
    for kernels in ("native", "avx2"):
        if f"{kernels} after cold" in results.rows:
            lines += section({part: row for name, row in results.rows.items()
                              if (part := name.removeprefix(f"{kernels} ")) != name}, KERNELS[kernels])
    return "\n".join(lines)


def section(rows: dict, kernels: str) -> list[str]:
    """One CPU class's page, from its rows (`run`, `before cold`, `after warm`, ...; a stopped run's are partial)."""
    run = rows["run"]
    before, after = ({"cold": rows.get(f"{label} cold", {}), "server_start": rows.get(f"{label} server start"),
                      "warm": rows.get(f"{label} warm", {})} for label in ("before", "after"))

    def cell(row: dict) -> str:
        return f"{row['wall']['p50']:.2f} / {row['wall']['p90']:.2f} · {row['cpu']['p50']:.2f}"

    lines = [
        f"## {kernels[0].upper() + kernels[1:]}",
        "",
        f"Made by `{run['command']}` (make bench-latency) · baseline {run['baseline']} · commit {run['commit']} · "
        f"{run['machine']} · {run['questions']} warm questions." + ("" if "cold run" not in rows else
        f" The cold rows and the server start were measured again by `{rows['cold run']['command']}` · commit "
        f"{rows['cold run']['commit']} · {rows['cold run']['machine']}; the warm rows are the first run's."),
        "",
        "| step | before | after |",
        "|---|---|---|",
    ]
    for name in after["cold"]:
        if name in before["cold"]:
            lines.append(f"| cold `{name.removeprefix('gradfuse ')}` | {cell(before['cold'][name])} | "
                         f"{cell(after['cold'][name])} |")
    if before["server_start"] and after["server_start"]:
        lines.append(f"| server start (no --preload-lm) | {cell(before['server_start'])} | "
                     f"{cell(after['server_start'])} |")
    for name in after["warm"]:
        if name in before["warm"]:
            lines.append(f"| warm {name} | {cell(before['warm'][name])} | {cell(after['warm'][name])} |")
    repeated, kept_alive = (after["warm"][f"/ask repeated question{how}"] for how in ("", ", kept-alive"))
    if "python -c pass" in after["cold"]:
        bare = after["cold"]["python -c pass"]["wall"]["p50"]
        lines += ["", f"Cold commands (after) against a bare `python -c pass` in the same run ({bare:.3f} s) and "
                      "issue 71's targets: " + "; ".join(
                          f"`{name.removeprefix('gradfuse ')}` {after['cold'][name]['wall']['p50']:.2f} s = "
                          f"{after['cold'][name]['wall']['p50'] / bare:.0f}× (target {target:g} s: "
                          + ("met" if after["cold"][name]["wall"]["p50"] <= target else
                             f"missed by {after['cold'][name]['wall']['p50'] - target:.2f} s") + ")"
                          for name, target in COLD_TARGETS.items()) + "."]
    lines += [
        "",
        f"A repeated question (after), p50: {repeated['wall']['p50'] * 1000:.1f} ms on a new connection per request, "
        f"{kept_alive['wall']['p50'] * 1000:.1f} ms on a kept-alive one (server CPU "
        f"{kept_alive['cpu']['p50'] * 1000:.1f} ms), "
        f"{'served from the cache' if repeated['cached'] and kept_alive['cached'] else 'NOT served from the cache'}.",
        "",
        "Evidence (what /ask adds over /search, the extractive answer's quoting), p50 seconds: "
        + ", ".join(f"{name} {before['warm'][f'/ask {name}']['evidence']['p50']:.3f} → "
                    f"{after['warm'][f'/ask {name}']['evidence']['p50']:.3f}"
                    for name in [*METHODS, "real documents"] if f"/ask {name}" in before["warm"]) + ".",
        "",
        "| ranking | questions | Spearman mean · min | same first |",
        "|---|---:|---|---:|",
    ]
    for name, row in rows.get("agreement", {}).items():
        lines.append(f"| /search {name}: after against before | {row['questions']} | {row['spearman_mean']:.3f} · "
                     f"{row['spearman_min']:.3f} | {row['same_first']:.2f} |")
    vectors = rows.get("query vectors")
    lines += [] if vectors is None else [
        "",
        f"Query vectors of the ONNX copy: at most {vectors['max_abs_vs_float32']:.1e} from sentence-transformers' "
        f"float32 vectors, cosine at least {vectors['min_cosine_vs_bfloat16']:.5f} to its bf16 vectors. The "
        "scoring LM's bf16 against float32 on the benchmarks' LM rows: precision.md.",
        "",
    ]
    return lines


if __name__ == "__main__":
    main()
