"""`gradfuse tune` and `gradfuse eval`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from gradfuse.cli.common import ConfigOpt, WorkspaceOpt, _run_guarded, _workspace, app, console, escape


@app.command()
def tune(
    bench_file: Annotated[Path, typer.Argument(help="Benchmark TOML naming this workspace's sources and your labelled "
                                                    "queries (see benchmarks/)")],
    write: Annotated[bool, typer.Option(help="Write the chosen settings into the config file")] = False,
    write_lm_settings: Annotated[bool, typer.Option(
        help="With --write, also write the benchmark's own [lm] model, sizes and limits (n, doc_tokens, "
             "max_pass_tokens, ...)")] = False,
    quick: Annotated[bool, typer.Option(help="The file's small [quick] variant")] = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Run a benchmark's dev queries over this workspace's own sources and show the settings they choose (fusion
    weights, stage 1's, stage 2's, the default method); --write puts them into gradfuse.toml with their dev scores,
    for search and serve."""
    from gradfuse.eval import load_benchmark
    from gradfuse.eval.tune import tune as run_tune
    from gradfuse.eval.tune import write_tuned

    ws = _workspace(config, workspace)
    bench = _run_guarded(lambda: load_benchmark(bench_file, quick=quick))
    _, values = _run_guarded(lambda: run_tune(bench, ws.root))
    for value in values:
        console.print(f"\\[{escape(value.section)}] {escape(value.key)} = {escape(repr(value.value))}  "
                      f"[dim]# {escape(value.why)}[/]")
    if not write:
        console.print("(not written: add --write to put these into the config file)")
        return
    target = config or Path("gradfuse.toml")
    held = [value for value in values if value.lm_setting and not write_lm_settings]
    if not target.exists():  # a new file must say which workspace it tunes
        target.write_text(f"workspace = {json.dumps(os.path.relpath(ws.root, target.resolve().parent))}\n")
    from gradfuse.config import load_config

    # what is written must read back as a valid configuration before it replaces the file
    _run_guarded(lambda: write_tuned(target, [value for value in values if value not in held],
                                     lambda written: load_config(written, workspace=workspace)))
    console.print(f"[green]written[/] to {target}: gradfuse search and serve use them")
    if held:
        console.print("not written (the dev scores held under them; --write-lm-settings writes them): "
                      + ", ".join(f"[rerank] {escape(v.key)} = {escape(repr(v.value))}" for v in held))


@app.command("eval")
def evaluate(
    bench_file: Annotated[Path, typer.Argument(help="Benchmark TOML (see benchmarks/)")],
    quick: Annotated[bool, typer.Option(help="The file's small [quick] variant")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Results folder (default results/<benchmark>)")] = None,
    runs: Annotated[Optional[Path], typer.Option(
        help="Folder for the TREC run files, kept out of git (default .gradfuse/runs/<benchmark>)")] = None,
    check: Annotated[bool, typer.Option(help="Fail when a score moved beyond the stored expected scores")] = False,
    update_expected: Annotated[bool, typer.Option(help="Store this run's scores as the expected ones")] = False,
    ray: Annotated[Optional[str], typer.Option(
        help="Run the scoring-LM methods on scorer replicas on this Ray cluster: auto, HOST:PORT or ray://HOST:PORT "
             "(pip install 'gradfuse[ray]')")] = None,
    replicas: Annotated[Optional[int], typer.Option(
        help="Scorer replicas with --ray (default: one per GPU, or one per node without GPUs)", min=1)] = None,
    methods: Annotated[Optional[str], typer.Option(
        help="Only these of the file's methods, comma-separated (single:* for every single source); recorded in the "
             "results' command line")] = None,
):
    """Run every method of a benchmark on the same candidates; write results.md/json, TREC runs and plots."""
    import shlex
    import sys

    from gradfuse.eval import check_expected, load_benchmark, run_benchmark, write_results
    from gradfuse.eval.report import write_partial
    from gradfuse.eval.expected import expected_path, write_expected

    from gradfuse.execute import make_executor

    bench = _run_guarded(lambda: load_benchmark(bench_file, quick=quick))
    if methods:
        bench = _run_guarded(lambda: bench.only(methods.split(",")))
    out = out or Path("results") / bench.name
    executor = _run_guarded(lambda: make_executor(ray, replicas=replicas))
    if ray:
        console.print(f"scoring-LM methods run on the {executor.describe()}")
    command = "gradfuse " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        evaluation = _run_guarded(lambda: run_benchmark(
            bench, executor=executor, checkpoint=lambda so_far: write_partial(so_far, out, command)))
        if ray:
            console.print(f"scoring-LM methods ran on the {executor.describe()}")
    finally:
        executor.close()
    summary = write_results(evaluation, out, command, runs or Path(".gradfuse") / "runs" / bench.name)
    console.print(f"[green]{bench.name}[/]: {len(evaluation.queries)} queries in "
                  f"{evaluation.wall_seconds / 60:.1f} min → {out / 'results.md'}")
    headline = bench.headline_metric
    for table in summary["tables"]:
        console.print(f"[bold]{table['name']}[/] ({table['queries']} queries), {headline}: " + ", ".join(
            f"{row['method']} {row[headline]['mean']:.3f}" for row in table["rows"] if headline in row))
    expected = expected_path(bench_file, quick)
    if update_expected:
        write_expected(expected, summary)
        console.print(f"expected scores written to {expected}")
    if check:
        problems = check_expected(expected, summary)
        for line in problems:
            console.print(f"[bold red]moved:[/] {line}")
        if problems:
            raise typer.Exit(1)
        console.print(f"[green]every score within the tolerance of {expected}[/]")
