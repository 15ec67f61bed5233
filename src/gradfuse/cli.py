"""`gradfuse`: a thin shell over `gradfuse.Workspace`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from gradfuse.config import ConfigError
from gradfuse.fusion import UnknownMethod
from gradfuse.sources import BuildReport, IngestError, SourceError, SourceSpec
from gradfuse.sources.federated import AllSourcesFailed, SourceFailure
from gradfuse.workspace import Answer, SearchResult, Workspace

app = typer.Typer(help="Retrieval-augmented generation over many sources at once.", no_args_is_help=True)
index_app = typer.Typer(help="Build a source from an input (re-running on unchanged input is a no-op).")
app.add_typer(index_app, name="index")
console = Console()
if not console.is_terminal:  # piped or logged output: do not squeeze tables into 80 columns
    console = Console(width=160)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="Workspace TOML (default ./gradfuse.toml)")]
WorkspaceOpt = Annotated[Optional[Path], typer.Option("--workspace", "-w", help="Index folder (overrides the config)")]
SourceName = Annotated[str, typer.Option("--source", "-s", help="Name of the source to create or rebuild")]
SkipMalformed = Annotated[bool, typer.Option(help="Skip and count malformed JSONL lines instead of failing")]


def _workspace(config: Path | None, workspace: Path | None) -> Workspace:
    try:
        return Workspace.open(config, workspace=workspace)
    except ConfigError as error:
        _fail(str(error))


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def _run_guarded(action):
    """Turn the library's specific errors into one clear line and exit code 2, instead of a traceback."""
    try:
        return action()
    except (SourceError, IngestError, UnknownMethod, AllSourcesFailed, ConfigError, ValueError) as error:
        _fail(str(error))


def _print_build(report: BuildReport) -> None:
    if report.status == "unchanged":
        console.print(f"[green]{report.name}[/]: unchanged ({report.documents} documents), nothing rebuilt")
        return
    console.print(
        f"[green]{report.name}[/]: built {report.documents} documents in {report.seconds:.1f} s "
        f"({report.docs_per_second:.0f} docs/s; {report.embedded_now} embedded now, the rest from cache)"
    )
    problems = {k: v for k, v in report.ingest.items() if v}
    if problems:
        console.print(f"  [yellow]ingest:[/] {problems}")


def _index(config, workspace, spec: SourceSpec) -> None:
    ws = _workspace(config, workspace)
    _print_build(_run_guarded(lambda: ws.index(spec, progress=True)))


@index_app.command("beir")
def index_beir(folder: Path, source: SourceName, skip_malformed: SkipMalformed = False,
               config: ConfigOpt = None, workspace: WorkspaceOpt = None):
    """A BEIR-style folder (corpus.jsonl with id/title/text)."""
    _index(config, workspace, SourceSpec(source, "beir", str(folder), {"skip_malformed": skip_malformed}))


@index_app.command("jsonl")
def index_jsonl(
    file: Path,
    source: SourceName,
    id_field: str = "id",
    text_field: str = "text",
    title_field: str = "title",
    chunk_words: Annotated[int, typer.Option(help="Cut records into chunks of this many words (0: keep whole)")] = 0,
    skip_malformed: SkipMalformed = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """A JSON-lines file, one document per line."""
    options = {"id_field": id_field, "text_field": text_field, "title_field": title_field,
               "skip_malformed": skip_malformed}
    if chunk_words:
        options["chunk_words"] = chunk_words
    _index(config, workspace, SourceSpec(source, "jsonl", str(file), options))


@index_app.command("files")
def index_files(
    folder: Path,
    source: SourceName,
    chunk_words: int = 200,
    chunk_overlap: int = 40,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """A folder of .txt/.md/.html files, cut into overlapping chunks."""
    options = {"chunk_words": chunk_words, "chunk_overlap": chunk_overlap}
    _index(config, workspace, SourceSpec(source, "files", str(folder), options))


@index_app.command("run")
def index_run(
    run: Path,
    source: SourceName,
    corpus: Annotated[Path, typer.Option(help="corpus.jsonl holding the run's documents")],
    queries: Annotated[Optional[Path], typer.Option(help="queries.jsonl (default: beside the corpus)")] = None,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """A TREC run file (qid Q0 docid rank score tag): answers the queries it was made for."""
    options = {"corpus": str(corpus.resolve())}
    if queries:
        options["queries"] = str(queries.resolve())
    _index(config, workspace, SourceSpec(source, "run", str(run), options))


@app.command()
def build(config: ConfigOpt = None, workspace: WorkspaceOpt = None):
    """Build every source declared in the config file (unchanged ones are skipped)."""
    ws = _workspace(config, workspace)
    for report in _run_guarded(lambda: ws.build_configured(progress=True)):
        _print_build(report)


@app.command()
def sources(config: ConfigOpt = None, workspace: WorkspaceOpt = None,
            as_json: Annotated[bool, typer.Option("--json")] = False):
    """Each built source: kind, documents, index size, encoder, when it was built."""
    ws = _workspace(config, workspace)
    stats = _run_guarded(ws.stats)
    if as_json:
        print(json.dumps([asdict(s) for s in stats], indent=2))
        return
    table = Table("source", "kind", "documents", "index", "encoder", "retrieval", "built (UTC)", "input")
    for s in stats:
        table.add_row(s.name, s.kind, str(s.documents), f"{s.index_bytes / 1e6:.1f} MB", s.encoder or "-",
                      s.retrieval, s.built_at, s.input)
    console.print(table if stats else f"no sources built in {ws.root}")


Fusion = Annotated[Optional[str], typer.Option("--fusion", "-f",
                   help="concat | rrf | combsum | combsum-z | combmnz | combmnz-z | single:<source>")]
Sources = Annotated[Optional[list[str]], typer.Option("--source", "-s", help="Query only these sources")]
Retrieval = Annotated[Optional[str], typer.Option(help="bm25 | dense | hybrid (within each source)")]
Timeout = Annotated[Optional[float], typer.Option("--timeout", help="Seconds each source may take")]


@app.command()
def search(
    query: str,
    fusion: Fusion = None,
    k: Annotated[Optional[int], typer.Option("--k", "-k")] = None,
    source: Sources = None,
    retrieval: Retrieval = None,
    timeout: Timeout = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Fused ranked list: every row shows its source, doc id, rank in source and scores."""
    ws = _workspace(config, workspace)
    result = _run_guarded(lambda: ws.search(query, fusion=fusion, k=k, sources=source, retrieval=retrieval,
                                            timeout_s=timeout))
    if as_json:
        print(json.dumps(search_json(result), indent=2))
        return
    _print_candidates(result)
    _print_failures(result.failures)
    console.print(_timing_line(result.timings))


def search_json(result: SearchResult) -> dict:
    return {
        "query": result.query,
        "method": result.method,
        "candidates": [_candidate_json(c) for c in result.candidates],
        "failures": [asdict(f) for f in result.failures],
        "timings": result.timings,
    }


def _candidate_json(candidate) -> dict:
    record = asdict(candidate)
    record["merged"] = [{"source": m.source, "doc_id": m.doc_id, "native_rank": m.native_rank,
                         "native_score": m.native_score} for m in candidate.merged]
    return record


def _print_candidates(result: SearchResult) -> None:
    score_name = f"fusion:{result.method}"
    table = Table("#", score_name, "source", "doc id", "rank in source", "native score", "also in", "text",
                  title=f"{result.query!r}: {result.method}")
    for position, c in enumerate(result.candidates, start=1):
        also = ", ".join(f"{m.source}/{m.doc_id}@{m.native_rank}" for m in c.merged) or "-"
        snippet = (c.title + ": " if c.title else "") + " ".join(c.text.split())
        table.add_row(str(position), f"{c.scores[score_name]:.4f}", c.source, c.doc_id, str(c.native_rank),
                      f"{c.native_score:.4f}", also, snippet[:90])
    console.print(table)


def _print_failures(failures: list[SourceFailure]) -> None:
    for f in failures:
        console.print(f"[yellow]source {f.source} failed ({f.reason}):[/] {f.detail}")


def _timing_line(timings: dict[str, float]) -> str:
    return "[dim]" + "  ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in timings.items()) + "[/]"


@app.command()
def ask(
    question: str,
    fusion: Fusion = None,
    context_k: Annotated[Optional[int], typer.Option("--k", "-k", help="Passages given to the generator")] = None,
    source: Sources = None,
    retrieval: Retrieval = None,
    timeout: Timeout = None,
    generator: Annotated[Optional[str], typer.Option(help="smollm2 | HF folder | .gguf file | http(s) URL")] = None,
    max_new_tokens: Optional[int] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Answer from the generator, with citations [n] mapped to source/doc id."""
    ws = _workspace(config, workspace)
    answer = _run_guarded(lambda: ws.ask(question, fusion=fusion, context_k=context_k, sources=source,
                                         retrieval=retrieval, timeout_s=timeout, generator=generator,
                                         max_new_tokens=max_new_tokens))
    if as_json:
        print(json.dumps(answer_json(answer), indent=2))
        return
    print_answer(answer)


def answer_json(answer: Answer) -> dict:
    return {
        "question": answer.question,
        "answer": answer.text,
        "citations": [asdict(c) for c in answer.citations],
        "invalid_citations": answer.invalid_citations,
        "passages": [_candidate_json(c) for c in answer.passages],
        "failures": [asdict(f) for f in answer.failures],
        "generator": answer.generator,
        "timings": answer.timings,
    }


def print_answer(answer: Answer) -> None:
    console.rule(f"[bold]{answer.question}")
    for number, p in enumerate(answer.passages, start=1):
        console.print(f"  [{number}] [cyan]{p.source}[/]/{p.doc_id} (rank {p.native_rank} in source) "
                      f"{(p.title or ' '.join(p.text.split()))[:70]}")
    console.print(f"\n[bold]Answer[/] ({answer.generator}): {answer.text}\n")
    for c in answer.citations:
        console.print(f"  cites [{c.number}] → [cyan]{c.source}[/]/{c.doc_id}")
    if not answer.citations:
        console.print("  [yellow]the answer cites no passage[/]")
    if answer.invalid_citations:
        console.print(f"  [yellow]cited numbers with no passage: {answer.invalid_citations}[/]")
    _print_failures(answer.failures)
    console.print(_timing_line(answer.timings))


@app.command()
def demo(workspace: Annotated[Path, typer.Option("--workspace", "-w")] = Path(".gradfuse/demo")):
    """Build three sources from text every Python has, then ask questions that need different sources.

    Dense retrieval with concatenation by cosine: one encoder for all sources makes those scores comparable,
    whereas rank fusion (RRF) puts every source's first hit on top whether or not that source is relevant."""
    from gradfuse.demo import QUESTIONS, demo_specs

    ws = Workspace.open(None, workspace=workspace)
    for spec in demo_specs(workspace / "inputs"):
        _print_build(ws.index(spec, progress=True))
    sources(None, workspace)
    for question in QUESTIONS:
        print_answer(ws.ask(question, fusion="concat", retrieval="dense", context_k=3))
