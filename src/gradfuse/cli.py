"""`gradfuse`: a thin shell over `gradfuse.Workspace`."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table

from gradfuse.config import ConfigError, load_config
from gradfuse.execute import RayUnavailable
from gradfuse.fusion import UnknownMethod
from gradfuse.generate import describe_generator
from gradfuse.generate.openai_http import EndpointError
from gradfuse.methods import METHOD_CHOICES
from gradfuse.rerank.base import SIGNALS
from gradfuse.redact import redact
from gradfuse.schemas import answer_record, search_record, source_record
from gradfuse.sources import BuildReport, IngestError, SourceError, SourceSpec, check_source_name
from gradfuse.sources.federated import AllSourcesFailed, SourceFailure
from gradfuse.sources.readers import LIMIT_OPTIONS, ReaderLimits
from gradfuse.workspace import Answer, SearchResult, Workspace

# Help texts are printed as written: with Rich markup on, "[server]" in a help string vanished.
app = typer.Typer(help="Retrieval-augmented generation over many sources at once.", no_args_is_help=True,
                  rich_markup_mode=None)
index_app = typer.Typer(help="Build a source from an input (re-running on unchanged input is a no-op).",
                        rich_markup_mode=None)
app.add_typer(index_app, name="index")
# Document text is data: ":smile:" stays ":smile:" (emoji codes off; markup in data is escaped where printed).
console = Console(emoji=False)
if not console.is_terminal:  # piped or logged output: do not squeeze tables into 80 columns
    console = Console(width=160, emoji=False)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape(text: str) -> str:
    """Data (document text, ids, titles, answers) as printable text: control characters are shown as \\x1b,
    never sent to the terminal (an indexed ESC[2J cleared the user's screen), and markup is escaped."""
    return escape_markup(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text))


ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="Workspace TOML (default ./gradfuse.toml)")]
WorkspaceOpt = Annotated[Optional[Path], typer.Option("--workspace", "-w", help="Index folder (overrides the config)")]
def _source_name(value):
    """A usage error (exit 2) for a bad name, before anything runs."""
    try:
        return [check_source_name(v) for v in value] if isinstance(value, list) else (
            check_source_name(value) if value is not None else None)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


SourceName = Annotated[str, typer.Option("--source", "-s", help="Name of the source to create or rebuild",
                                         callback=_source_name)]
SkipMalformed = Annotated[bool, typer.Option(help="Skip and count malformed JSONL lines instead of failing")]
Into = Annotated[Optional[str], typer.Option(help="Load into a PostgreSQL table instead (postgresql://... URL); "
                                                  "the table is registered in the workspace as the source")]
Wait = Annotated[bool, typer.Option(help="If another process is building this source, wait for it instead of "
                                         "failing")]
TableName = Annotated[Optional[str], typer.Option(help="Table for --into (default: the source name)")]
Language = Annotated[Optional[str], typer.Option(help="Text search configuration for --into (default english)")]


def _workspace(config: Path | None, workspace: Path | None) -> Workspace:
    try:
        return Workspace.open(config, workspace=workspace)
    except ConfigError as error:
        _fail(str(error))


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(redact(message))}")
    raise typer.Exit(2)


def _run_guarded(action):
    """Turn the library's specific errors into one clear line and exit code 2, instead of a traceback."""
    try:
        return action()
    except (SourceError, IngestError, UnknownMethod, AllSourcesFailed, ConfigError, RayUnavailable, EndpointError,
            ValueError) as error:
        _fail(str(error))


def _print_build(report: BuildReport) -> None:
    if report.written is not None and report.status == "built":
        console.print(f"[green]{report.name}[/]: {report.documents} documents in the table: {report.written} "
                      f"written, {report.deleted} deleted, {report.embedded_now} embedded now "
                      f"({report.seconds:.1f} s)")
        return
    if report.status == "unchanged":
        console.print(f"[green]{report.name}[/]: unchanged ({report.documents} documents), nothing rebuilt")
    else:
        console.print(
            f"[green]{report.name}[/]: built {report.documents} documents in {report.seconds:.1f} s "
            f"({report.docs_per_second:.0f} docs/s; {report.embedded_now} embedded now"
            + (f" by {report.encoder}" if report.encoder else "") + ", the rest from cache)")
    for note in report.notes:
        console.print(f"  [yellow]note:[/] {escape(note)}")
    if report.formats:
        console.print("  read: " + ", ".join(f"{count} {kind}" for kind, count in sorted(report.formats.items())))
    problems = {k: v for k, v in report.ingest.items() if v}
    if problems:
        console.print(f"  [yellow]ingest:[/] {problems}")
    if report.skipped:
        console.print(f"  [yellow]skipped {len(report.skipped)} file(s)[/]: "
                      + ", ".join(f"{count} {reason}" for reason, count in report.skipped_by_reason.items()))
        for name, reason, detail in report.skipped:
            console.print(f"    {escape(name)}: {reason} ({escape(detail)})")
    if report.cut:
        console.print("  [yellow]read in part, to a limit:[/]")
        for cut in report.cut:
            console.print(f"    {escape(cut)}")


def _index(config, workspace, spec: SourceSpec, into=None, table=None, language=None, wait=False) -> None:
    ws = _workspace(config, workspace)
    _print_build(_run_guarded(lambda: ws.index(spec, into=into, table=table, language=language, progress=True,
                                               wait=wait)))


@index_app.command("beir")
def index_beir(folder: Path, source: SourceName, skip_malformed: SkipMalformed = False, into: Into = None,
               table: TableName = None, language: Language = None, config: ConfigOpt = None,
               workspace: WorkspaceOpt = None, wait: Wait = False):
    """A BEIR-style folder (corpus.jsonl with id/title/text)."""
    _index(config, workspace, SourceSpec(source, "beir", str(folder), {"skip_malformed": skip_malformed}), into,
           table, language, wait)


@index_app.command("jsonl")
def index_jsonl(
    file: Path,
    source: SourceName,
    id_field: str = "id",
    text_field: str = "text",
    title_field: str = "title",
    chunk_words: Annotated[int, typer.Option(help="Cut records into chunks of this many words (0: keep whole)")] = 0,
    skip_malformed: SkipMalformed = False,
    into: Into = None,
    table: TableName = None,
    language: Language = None,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
    wait: Wait = False,
):
    """A JSON-lines file, one document per line."""
    options = {"id_field": id_field, "text_field": text_field, "title_field": title_field,
               "skip_malformed": skip_malformed}
    if chunk_words:
        options["chunk_words"] = chunk_words
    _index(config, workspace, SourceSpec(source, "jsonl", str(file), options), into, table, language, wait)


@index_app.command("files")
def index_files(
    folder: Path,
    source: SourceName,
    chunk_words: int = 200,
    chunk_overlap: int = 40,
    links_outside: Annotated[bool, typer.Option(help="Also index files behind links that lead out of the folder "
                                                     "(skipped and reported by default)")] = False,
    max_file_mb: Annotated[int, typer.Option(help="Skip a larger file")] = ReaderLimits.max_file_mb,
    max_pages: Annotated[int, typer.Option(help="Skip a PDF or deck with more pages or slides")] = ReaderLimits.max_pages,
    max_rows: Annotated[int, typer.Option(help="Skip a spreadsheet with more rows")] = ReaderLimits.max_rows,
    max_unzipped_mb: Annotated[int, typer.Option(
        help="Skip an Office file whose parts unzip to more (a zip bomb)")] = ReaderLimits.max_unzipped_mb,
    max_zip_entries: Annotated[int, typer.Option(
        help="Skip an Office file with more parts in its zip")] = ReaderLimits.max_zip_entries,
    deadline_s: Annotated[float, typer.Option(help="Skip a file not parsed within this time")] = ReaderLimits.deadline_s,
    max_text_mb: Annotated[int, typer.Option(
        help="Skip a file that produces more text (all its chunks)")] = ReaderLimits.max_text_mb,
    max_chunks: Annotated[int, typer.Option(help="Skip a file that makes more chunks")] = ReaderLimits.max_chunks,
    max_worker_mb: Annotated[int, typer.Option(
        help="Memory of the process that parses; a file that needs more is skipped")] = ReaderLimits.max_worker_mb,
    max_page_chars: Annotated[int, typer.Option(
        help="Cut a PDF page's text at this many characters")] = ReaderLimits.max_page_chars,
    max_cell_chars: Annotated[int, typer.Option(
        help="Cut a table cell's text at this many characters")] = ReaderLimits.max_cell_chars,
    max_columns: Annotated[int, typer.Option(help="Leave out a table row's cells after this many")] = ReaderLimits.max_columns,
    max_header_chars: Annotated[int, typer.Option(
        help="Cut what every chunk repeats (a table's header row, headings, a title) at this many characters"
    )] = ReaderLimits.max_header_chars,
    max_ocr_megapixels: Annotated[int, typer.Option(
        help="Render a page for OCR at most this large (larger pages below 300 dpi)")] = ReaderLimits.max_ocr_megapixels,
    ocr: Annotated[bool, typer.Option(help="Read PDF pages without a text layer with Tesseract "
                                           "(apt-get install tesseract-ocr; pip install 'gradfuse[ocr]')")] = False,
    into: Into = None,
    table: TableName = None,
    language: Language = None,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
    wait: Wait = False,
):
    """A folder of files: .txt, .md, .html, .pdf, .docx, .pptx, .xlsx, .csv (by content where the extension lies),
    cut into overlapping chunks inside each page, section, slide or sheet, which keep where they stand."""
    given = locals()
    limits = {name: given[name] for name in LIMIT_OPTIONS}
    options = {"chunk_words": chunk_words, "chunk_overlap": chunk_overlap,
               **{k: v for k, v in limits.items() if v != getattr(ReaderLimits, k)},
               **({"links_outside": True} if links_outside else {})}
    _index(config, workspace, SourceSpec(source, "files", str(folder), options), into, table, language, wait)


@index_app.command("run")
def index_run(
    run: Path,
    source: SourceName,
    corpus: Annotated[Path, typer.Option(help="corpus.jsonl holding the run's documents")],
    queries: Annotated[Optional[Path], typer.Option(help="queries.jsonl (default: beside the corpus)")] = None,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
    wait: Wait = False,
):
    """A TREC run file (qid Q0 docid rank score tag): answers the queries it was made for."""
    options = {"corpus": str(corpus.resolve())}
    if queries:
        options["queries"] = str(queries.resolve())
    _index(config, workspace, SourceSpec(source, "run", str(run), options), wait=wait)


@app.command()
def build(config: ConfigOpt = None, workspace: WorkspaceOpt = None):
    """Build every source declared in the config file (unchanged ones are skipped)."""
    ws = _workspace(config, workspace)
    for report in _run_guarded(lambda: ws.build_configured(progress=True)):
        _print_build(report)


@app.command()
def sources(config: ConfigOpt = None, workspace: WorkspaceOpt = None,
            as_json: Annotated[bool, typer.Option("--json")] = False):
    """Each built source: kind, documents, index size, encoder, when it was built (or why it cannot be read)."""
    ws = _workspace(config, workspace)
    health = _run_guarded(ws.source_health)
    if as_json:
        print(json.dumps([source_record(*entry).model_dump() for entry in health], indent=2))
        return
    table = Table("source", "kind", "documents", "index", "encoder", "retrieval", "built (UTC)", "input")
    for name, s, error in health:
        if s is None:
            table.add_row(escape(name), "[red]unreadable[/]", "-", "-", "-", "-", "-", escape(error))
        else:
            size = f"{s.index_bytes / 1e6:.1f} MB" if s.index_bytes is not None else "-"
            table.add_row(escape(s.name), s.kind, str(s.documents), size,
                          s.encoder or "-", s.retrieval, s.built_at, escape(s.input))
    console.print(table if health else f"no sources built in {ws.root}")


Method = Annotated[Optional[str], typer.Option("--method", "-m", "--fusion", help=METHOD_CHOICES)]
Sources = Annotated[Optional[list[str]], typer.Option("--source", "-s", help="Query only these sources",
                                                     callback=_source_name)]
Retrieval = Annotated[Optional[str], typer.Option(help="bm25 | dense | hybrid (within each source)")]
Timeout = Annotated[Optional[float], typer.Option("--timeout", help="Seconds each source may take")]
Target = Annotated[Optional[str], typer.Option(help="Stage-2 target: draft | gold | query")]
Estimator = Annotated[Optional[str], typer.Option(help="Stage-2 estimator: gate | reader_gate | grad_x_input")]
Signal = Annotated[Optional[str], typer.Option("--scorer", help=(
    f"gro's stage-2 signal: {' | '.join(SIGNALS)}. Default upr: of the signals measured on all three benchmarks it "
    "ranks the held-out queries best (results/stage2/defaults.md); gradient is the paper's"))]
Pool = Annotated[Optional[int], typer.Option("--n", help="Candidates entering the stage-2 LM pass")]
PoolOrder = Annotated[Optional[str], typer.Option("--pool", help="Stage-2 pool and prior: cosine | rrf | combsum-z")]
Gold = Annotated[Optional[str], typer.Option(help="Reference answer (needed by --target gold)")]
Explain = Annotated[bool, typer.Option(help="Show stage 1's decision and each document's prior, stage-2 and final score")]


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
    ws = _workspace(config, workspace)
    options = _rerank_options(target, estimator, n, pool, scorer)
    result = _run_guarded(lambda: ws.search(query, method=method, k=k, sources=source, retrieval=retrieval,
                                            timeout_s=timeout, gold=gold, **options))
    if as_json:
        print(search_record(result).model_dump_json(indent=2))
        return
    if explain:
        print_explanation(result)
    _print_candidates(result)
    _print_failures(result.failures)
    console.print(_timing_line(result.timings))


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
    ws = _workspace(config, workspace)
    answer = _run_guarded(lambda: ws.ask(question, method=method, context_k=context_k, sources=source,
                                         retrieval=retrieval, timeout_s=timeout, generator=generator,
                                         max_new_tokens=max_new_tokens, gold=gold,
                                         **_rerank_options(target, estimator, n, pool, scorer)))
    if as_json:
        print(answer_record(answer).model_dump_json(indent=2))
        return
    if explain:
        print_explanation(answer.search)
    print_answer(answer)


def print_answer(answer: Answer) -> None:
    console.rule(f"[bold]{escape(answer.question)}")
    for number, p in enumerate(answer.passages, start=1):
        where = p.location.describe() if p.location else (p.title or " ".join(p.text.split()))[:70]
        console.print(f"  \\[{number}] [cyan]{escape(p.source)}[/]/{escape(p.doc_id)} "
                      f"(rank {p.native_rank} in source) {escape(where)}")
    console.print(f"\n[bold]Answer[/]: {escape(answer.text)}\n")
    if answer.support is not None:
        verdict = "[yellow]too weak to answer from[/]" if answer.abstained else "enough to answer from"
        console.print(f"  support {answer.support:.2f} (the chance that these passages hold the answer): {verdict}")
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
    from gradfuse.rerank import load_scorer

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
        search = {key: value for key, value in question.search.items() if key != "k"}
        if search.get("method") == "gro":
            preload.join()
        console.print(f"\n[dim]{escape(question.how)}[/]")
        started = time.perf_counter()
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


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="Interface to bind (default 127.0.0.1, or [server] host)")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (default 8321, or [server] port)")] = None,
    preload_lm: Annotated[bool, typer.Option(help="Load the scoring LM and generator at start, not on first use")] = False,
    log_level: str = "info",
    insecure_no_key: Annotated[bool, typer.Option(
        help="Serve beyond loopback without an API key (anyone who can reach the port can use it)")] = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """HTTP API (/search, /ask, /sources, /healthz, /docs) and the web page at /, over this workspace."""
    from dataclasses import replace

    from gradfuse.server.app import serve as run_server

    from gradfuse.execute import make_executor

    ws = _workspace(config, workspace)
    settings = ws.config.server
    settings = replace(settings, host=host or settings.host, port=port if port is not None else settings.port)
    key = "API key required (X-API-Key)" if settings.resolved_api_key() else "no API key"
    if not settings.resolved_api_key() and not _loopback(settings.host) and not insecure_no_key:
        # Without a key only the Host check stands, and a client anywhere can send "Host: localhost".
        _fail(f"refusing to serve on {settings.host} without an API key: set GRADFUSE_API_KEY, or pass "
              "--insecure-no-key if every machine that can reach this port may use it")
    if settings.ray:
        ws.executor = _run_guarded(lambda: make_executor(settings.ray, replicas=settings.ray_replicas or None))
    console.print(f"gradfuse serving {ws.root} on http://{settings.host}:{settings.port}/ ({key}; "
                  f"API docs at /docs; OpenAI-compatible at /v1, MCP at /mcp; stage 2 scores in "
                  f"{ws.executor.describe()})")
    run_server(ws, settings, preload_lm=preload_lm, log_level=log_level)


@app.command()
def mcp(config: ConfigOpt = None, workspace: WorkspaceOpt = None):
    """An MCP server over stdio (tools search, ask, list_sources; passages as gradfuse:// resources), for an
    agent or a desktop assistant to start. `gradfuse serve` has the same at /mcp over HTTP."""
    from gradfuse.server.mcp_tools import build_mcp

    ws = _workspace(config, workspace)
    build_mcp(ws, ws.config.server).run("stdio")


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


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
    from gradfuse.eval.expected import expected_path, write_expected

    from gradfuse.execute import make_executor

    bench = _run_guarded(lambda: load_benchmark(bench_file, quick=quick))
    if methods:
        bench = _run_guarded(lambda: bench.only(methods.split(",")))
    out = out or Path("results") / bench.name
    executor = _run_guarded(lambda: make_executor(ray, replicas=replicas))
    if ray:
        console.print(f"scoring-LM methods run on the {executor.describe()}")
    try:
        evaluation = _run_guarded(lambda: run_benchmark(bench, executor=executor))
        if ray:
            console.print(f"scoring-LM methods ran on the {executor.describe()}")
    finally:
        executor.close()
    command = "gradfuse " + " ".join(shlex.quote(a) for a in sys.argv[1:])
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
