"""`gradfuse search`, `ask` and `demo`: results and answers as a person reads them."""

from __future__ import annotations

import shlex
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from gradfuse.cli.building import _print_build, sources
from gradfuse.cli.common import (
    ConfigOpt, Estimator, Explain, Gold, Method, Pool, PoolOrder, Retrieval, Signal, Sources, Target, Timeout,
    WorkspaceOpt, _run_guarded, _workspace, app, console, escape,
)

if TYPE_CHECKING:
    from gradfuse.federation.federated import SourceFailure
    from gradfuse.workspace import Answer, SearchResult


def _rerank_options(target, estimator, n, pool, scorer) -> dict:
    return {key: value for key, value in (("target", target), ("estimator", estimator), ("n", n), ("pool", pool),
                                          ("scorer", scorer)) if value}


@app.command()
def search(
    query: str,
    method: Method = None,
    k: Annotated[Optional[int], typer.Option("--k", "-k")] = None,
    source: Sources = None,
    retrieval: Retrieval = None,
    timeout: Timeout = None,
    target: Target = None,
    estimator: Estimator = None,
    scorer: Signal = None,
    n: Pool = None,
    pool: PoolOrder = None,
    gold: Gold = None,
    explain: Explain = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Ranked list over many sources: every row shows its source, doc id, rank in source and scores."""
    ws = _workspace(config, workspace, preload_encoder=True)
    options = _rerank_options(target, estimator, n, pool, scorer)
    result = _run_guarded(lambda: ws.search(query, method=method, k=k, sources=source, retrieval=retrieval,
                                            timeout_s=timeout, gold=gold, **options))
    if as_json:
        from gradfuse.schemas import search_record

        print(search_record(result).model_dump_json(indent=2))
        return
    if explain:
        print_explanation(result)
    _print_candidates(result)
    _print_failures(result.failures)
    console.print(_timing_line(result.timings))


@app.command()
def methods(config: ConfigOpt = None, workspace: WorkspaceOpt = None):
    """Every method --method takes (fusion of every asked source's list, or the pipeline: stage 1 chooses the
    sources, a stage-2 scorer re-ranks) and every signal --scorer gives gro, with the defaults this workspace uses."""
    from gradfuse.fusion import FUSION_METHODS
    from gradfuse.methods import CONFIGURED, METHOD_SPECS
    from gradfuse.rerank.base import SIGNALS

    ws = _workspace(config, workspace)
    table = Table("method", "stage 1 (chooses sources)", "stage 2 (re-ranks by)")
    for name in FUSION_METHODS:
        table.add_row(name, "no: every source asked, lists fused", "-")
    for name, spec in METHOD_SPECS.items():
        scorer = f"[rerank] scorer ({ws.config.rerank.scorer})" if spec.scorer == CONFIGURED else spec.scorer or "-"
        table.add_row(name, "yes" if spec.stage1 else "no", scorer)
    console.print(table)
    console.print(f"default method: {escape(ws.config.method)} · gro's signals (--scorer): {', '.join(SIGNALS)}")


def _main_score(candidate, method: str) -> str:
    for name in ("rerank:final", f"fusion:{method}", "fusion:rrf", "prior"):
        if name in candidate.scores:
            return f"{candidate.scores[name]:.4f}"
    return "-"


def _print_candidates(result: SearchResult) -> None:
    table = Table("#", "score", "source", "doc id", "rank in source", "native score", "also in", "text",
                  title=f"{result.query!r}: {result.method}")
    for position, c in enumerate(result.candidates, start=1):
        also = ", ".join(f"{m.source}/{m.doc_id}@{m.native_rank}" for m in c.merged) or "-"
        snippet = (c.title + ": " if c.title else "") + " ".join(c.text.split())
        table.add_row(str(position), _main_score(c, result.method), escape(c.source), escape(c.doc_id),
                      str(c.native_rank), f"{c.native_score:.4f}", escape(also), escape(snippet[:90]))
    console.print(table)


def print_explanation(result: SearchResult) -> None:
    routing = result.routing
    if routing is not None:
        skipped = routing.skipped
        console.print(f"[bold]Routing[/] ({routing.router}): asked {len(routing.asked)} of "
                      f"{len(routing.asked) + len(skipped)} sources: {escape(', '.join(routing.asked))}")
        if routing.widened:
            console.print(f"  {routing.widened} beyond the budget of {routing.budget}: their summaries scored within "
                          "[routing] widen_margin of the best, too close to tell apart", markup=False)
        for name, why in routing.unscored.items():
            console.print(f"  [yellow]asked unjudged[/] {escape(name)}: {escape(why)}")
        for name, why in list(skipped.items())[:5]:
            console.print(f"  [yellow]skipped[/] {escape(name)}: {escape(why)}")
        if len(skipped) > 5:
            console.print(f"  ... and {len(skipped) - 5} more (--json lists them all)")
    decision = result.selection
    if decision is not None:
        console.print("[bold]Stage 1: sources[/] (gain = relevance − λ·redundancy with those chosen before)")
        for step in decision.chosen:
            console.print(f"  [green]chosen[/] {step.source}: gain {step.gain:.3f} = relevance {step.relevance:.3f}"
                          f" − {step.penalty:.3f}")
        for name, why in decision.dropped.items():
            console.print(f"  [yellow]dropped[/] {escape(name)}: {escape(why)}")
    outcome = result.rerank
    if outcome is not None:
        loss = f", L(full context) = {outcome.loss:.3f}" if outcome.loss is not None else ""
        target = f", target {outcome.target!r}" if outcome.target is not None else ""
        console.print(f"[bold]Stage 2[/]: {outcome.scorer}{escape(target)}{loss}")
    names = ["prior:pool", "prior", *sorted({n for c in result.candidates for n in c.scores
                                            if n.startswith("rerank:") and n != "rerank:final"}), "rerank:final"]
    shown = [n for n in names if any(n in c.scores for c in result.candidates)]
    if shown:
        table = Table("#", "source/doc id", *shown, title="per-document scores")
        for position, c in enumerate(result.candidates, start=1):
            table.add_row(str(position), escape(c.key), *[f"{c.scores[n]:.4f}" if n in c.scores else "-" for n in shown])
        console.print(table)


def _print_failures(failures: list[SourceFailure]) -> None:
    for f in failures:
        console.print(f"[yellow]source {escape(f.source)} failed ({f.reason}):[/] {escape(f.detail)}")


def _timing_line(timings: dict[str, float]) -> str:
    return "[dim]" + "  ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in timings.items()) + "[/]"


@app.command()
def ask(
    question: str,
    method: Method = None,
    context_k: Annotated[Optional[int], typer.Option("--k", "-k", help="Passages given to the generator")] = None,
    source: Sources = None,
    retrieval: Retrieval = None,
    timeout: Timeout = None,
    target: Target = None,
    estimator: Estimator = None,
    scorer: Signal = None,
    n: Pool = None,
    pool: PoolOrder = None,
    gold: Gold = None,
    explain: Explain = False,
    generator: Annotated[Optional[str], typer.Option(help="smollm2 | HF folder | .gguf file | http(s) URL")] = None,
    max_new_tokens: Optional[int] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Answer with citations [n] mapped to source/doc id, and the evidence sentences it rests on: the evidence
    itself with the bundled generator ([generator] answer = "auto"), or the generator's answer."""
    ws = _workspace(config, workspace, preload_encoder=True)
    answer = _run_guarded(lambda: ws.ask(question, method=method, context_k=context_k, sources=source,
                                         retrieval=retrieval, timeout_s=timeout, generator=generator,
                                         max_new_tokens=max_new_tokens, gold=gold,
                                         **_rerank_options(target, estimator, n, pool, scorer)))
    if as_json:
        from gradfuse.schemas import answer_record

        print(answer_record(answer).model_dump_json(indent=2))
        return
    if explain:
        print_explanation(answer.search)
    print_answer(answer)


def print_answer(answer: Answer) -> None:
    from gradfuse.generate import describe_generator

    console.rule(f"[bold]{escape(answer.question)}")
    for number, p in enumerate(answer.passages, start=1):
        where = p.location.describe() if p.location else (p.title or " ".join(p.text.split()))[:70]
        console.print(f"  \\[{number}] [cyan]{escape(p.source)}[/]/{escape(p.doc_id)} "
                      f"(rank {p.native_rank} in source) {escape(where)}")
    console.print(f"\n[bold]Answer[/]: {escape(answer.text)}\n")
    if answer.support is not None:
        verdict = "[yellow]too weak to answer from[/]" if answer.abstained else "enough to answer from"
        at_least = "≥ " if answer.support_at_least else ""
        console.print(f"  support {at_least}{answer.support:.2f} (the chance that these passages hold the answer): "
                      f"{verdict}")
    if answer.evidence:
        console.print("  [bold]Evidence[/] (the passages' sentences most needed, best first):")
    for e in answer.evidence:
        where = f"{e.location.describe()}, " if e.location else ""
        console.print(f"    \\[{e.passage}] [cyan]{escape(e.source)}[/]/{escape(e.doc_id)} ({escape(where)}characters "
                      f"{e.span[0]}-{e.span[1]}): “{escape(e.quoted())}”")
    console.print(f"  [dim]written by {escape(describe_generator(answer.generator))}[/]")
    for c in answer.citations:
        where = f" ({escape(c.location.describe())})" if c.location else ""
        console.print(f"  cites \\[{c.number}] → [cyan]{escape(c.source)}[/]/{escape(c.doc_id)}{where}")
    if not answer.citations:
        console.print("  [yellow]the answer cites no passage[/]")
    if answer.unsupported:
        console.print("  [yellow]unsupported: no sentence of the passages holds what this answer says[/]")
    elif unbacked := [s for s in answer.statements if not s.supported]:
        console.print(f"  [yellow]{len(unbacked)} of {len(answer.statements)} sentences of the answer found no "
                      "support in the passages[/]")
    if answer.invalid_citations:
        console.print(f"  [yellow]cited numbers with no passage: {answer.invalid_citations}[/]")
    if answer.dropped:
        console.print(f"  [yellow]{len(answer.dropped)} lower-ranked passage(s) left out to fit the generator's "
                      f"context window: {escape(', '.join(f'{c.source}/{c.doc_id}' for c in answer.dropped))}[/]")
    _print_failures(answer.failures)
    console.print(_timing_line(answer.timings))


@app.command()
def demo(workspace: Annotated[Path, typer.Option("--workspace", "-w")] = Path(".gradfuse/demo")):
    """Build four sources (Python's documentation, gradfuse's guide as a PDF, a spreadsheet of share prices), then
    ask questions that need different sources and one that none of them answers, each answered by its evidence (or
    by the configured generator, where it is not the bundled one)."""
    from gradfuse.demo import QUESTIONS, demo_specs
    from gradfuse.generate import describe_generator
    from gradfuse.rerank import load_scorer
    from gradfuse.workspace import Workspace

    ws = Workspace.open(None, workspace=workspace)
    # The scoring LM loads (and on first use converts its GGUF, about 20 s) while the sources build and the first
    # questions are answered, so the gro question does not wait for it.
    rerank = ws.config.rerank
    preload = threading.Thread(target=load_scorer, args=(rerank.model, rerank.doc_tokens, rerank.dtype), daemon=True)
    preload.start()
    for spec in demo_specs(workspace / "inputs"):
        _print_build(ws.index(spec, progress=True))
    sources(None, workspace)
    for question in QUESTIONS:
        if question.search.get("method") == "gro":
            preload.join()
        console.print(f"\n[dim]{escape(question.how)}[/]")
        command = " ".join(["gradfuse ask", shlex.quote(question.text), *question.flags(), f"--workspace {workspace}"])
        console.print(f"[dim]{escape(command)}[/]")
        started = time.perf_counter()
        search = {key: value for key, value in question.search.items() if key != "k"}
        print_answer(ws.ask(question.text, context_k=question.search["k"], **search))
        console.print(f"[dim]({time.perf_counter() - started:.1f} s from question to answer)[/]")
    writer = ("the passages' own sentences, quoted: the bundled 135M generator's own answers held the right answer "
              "less than half as often. To have a model write them, set [generator] model in gradfuse.toml to an "
              "OpenAI-compatible URL or a local .gguf file" if ws.answers_extractively
              else f"written by {describe_generator(ws.config.generator)}")
    console.print(escape(f"\nThe answers are {writer}. To ask your own questions over these sources: gradfuse ask "
                         f"\"...\" --workspace {workspace} (add --method gro --explain to see both stages)."))
    console.print(escape(f"From other clients: gradfuse serve --workspace {workspace}, then an OpenAI client with "
                         "base_url http://127.0.0.1:8321/v1 and model \"gradfuse\", or an MCP client at "
                         f"http://127.0.0.1:8321/mcp (or over stdio: gradfuse mcp --workspace {workspace})."))
