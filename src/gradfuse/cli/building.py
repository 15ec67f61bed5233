"""`gradfuse index ...`, `build` and `sources`: building sources and listing them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from gradfuse.cli.common import (
    ConfigOpt, Into, Language, RayBuild, SkipMalformed, SourceName, TableName, Wait, WorkspaceOpt, _fail,
    _run_guarded, _workspace, app, console, escape, index_app,
)
from gradfuse.ingest.limits import LIMITS

if TYPE_CHECKING:
    from gradfuse.indexing import BuildReport
    from gradfuse.sources import SourceSpec


SKIPPED_SHOWN = 20  # files named per reason skipped; the rest counted


def _print_build(report: BuildReport) -> None:
    from gradfuse.redact import redact

    if report.status == "failed":
        console.print(f"[red]{report.name}[/]: failed: {escape(redact(report.error))}")
        return
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
        if report.files:
            files = report.files
            console.print(f"  files: {files['added']} added, {files['changed']} changed, {files['deleted']} deleted, "
                          f"{files['unchanged']} unchanged (not parsed again)")
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
        shown: dict[str, int] = {}
        for name, reason, detail in report.skipped:  # a folder of 2,000 images or .pyc files: the first of each
            shown[reason] = shown.get(reason, 0) + 1
            if shown[reason] <= SKIPPED_SHOWN:
                console.print(f"    {escape(name)}: {reason} ({escape(detail)})")
        for reason, count in report.skipped_by_reason.items():
            if count > SKIPPED_SHOWN:
                console.print(f"    … and {count - SKIPPED_SHOWN} more: {reason}")
    if report.cut:
        console.print("  [yellow]read in part, to a limit:[/]")
        for cut in report.cut:
            console.print(f"    {escape(cut)}")


def _spec(name: str, kind: str, path: str, options: dict) -> SourceSpec:
    from gradfuse.sources import SourceSpec

    return SourceSpec(name, kind, path, options)


def _index(config, workspace, spec: SourceSpec, into=None, table=None, language=None, wait=False,
           ray=None) -> None:
    from gradfuse.embedding.ray_batches import BuildSettings

    ws = _workspace(config, workspace)
    if ray:
        ws.config.build = BuildSettings(ray_address=ray)
    declared = _declared_elsewhere(ws, spec, into)
    if declared:
        _fail(declared)
    _print_build(_run_guarded(lambda: ws.index(spec, into=into, table=table, language=language, progress=True,
                                               wait=wait)))


def _declared_elsewhere(ws, spec: SourceSpec, into: str | None = None) -> str | None:
    """Why `spec` may not be built by `index`: the config declares a source of that name otherwise (another input,
    or an option this build would leave out or change, its readers among them: what they restrict would open), or
    as an engine's, which a table registered under its name would stand in for."""
    settings = ws.config.settings(spec.name)
    if settings.engine is not None or (settings.postgres is not None and into is None):
        held = "a PostgreSQL table" if settings.postgres else "a source an engine serves"
        return f"source {spec.name!r} is declared in the config as {held}: give this build another name"
    declared = settings.spec
    if declared is None:
        return None
    wanted, given = _comparable(declared), _comparable(spec)
    lost = sorted(k for k, v in wanted[2].items() if given[2].get(k) != v)
    if wanted[:2] == given[:2] and not lost:  # its own defaults beside them change what is built, not who reads it
        return None
    why = f"its options {', '.join(lost)} would be left out or changed" if lost else "its input differs"
    return (f"source {spec.name!r} is declared in the config ({declared.kind} {declared.path}) and {why}: "
            "`gradfuse build` builds it as declared")


def _comparable(spec: SourceSpec) -> tuple:
    paths = {k: str(Path(v).resolve()) for k, v in spec.options.items() if k in ("corpus", "queries")}
    return spec.kind, Path(spec.path).resolve(), {**spec.options, **paths}


@index_app.command("beir")
def index_beir(folder: Path, source: SourceName, skip_malformed: SkipMalformed = False, into: Into = None,
               table: TableName = None, language: Language = None, config: ConfigOpt = None,
               workspace: WorkspaceOpt = None, wait: Wait = False, ray: RayBuild = None):
    """A BEIR-style folder (corpus.jsonl with id/title/text)."""
    _index(config, workspace, _spec(source, "beir", str(folder), {"skip_malformed": skip_malformed}), into,
           table, language, wait, ray)


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
    ray: RayBuild = None,
):
    """A JSON-lines file, one document per line."""
    options = {"id_field": id_field, "text_field": text_field, "title_field": title_field,
               "skip_malformed": skip_malformed}
    if chunk_words:
        options["chunk_words"] = chunk_words
    _index(config, workspace, _spec(source, "jsonl", str(file), options), into, table, language, wait, ray)


@index_app.command("each")
def index_each(
    kind: Annotated[str, typer.Argument(help="jsonl (each *.jsonl file), files or beir (each subfolder)")],
    folder: Path,
    skip_malformed: SkipMalformed = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """One source for each JSON-lines file or subfolder of FOLDER, named after it: hundreds of sources (one per
    team, product or customer) in one command, read with each kind's defaults. Hidden entries are left alone; an
    entry whose name is no source name, or that fails to build, is reported and the others are built (exit 1)."""
    if kind not in ("jsonl", "files", "beir"):
        raise typer.BadParameter(f"kind {kind!r} is not one of jsonl, files, beir")
    if not folder.is_dir():
        raise typer.BadParameter(f"{folder} is not a folder")
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith(".") and (
        p.is_file() and p.suffix == ".jsonl" if kind == "jsonl" else p.is_dir()))
    if not entries:
        raise typer.BadParameter(f"{folder} holds no {'*.jsonl file' if kind == 'jsonl' else 'subfolder'}")
    specs, problems = [], []
    for entry in entries:  # every name checked before anything is built
        try:
            specs.append(_spec(entry.stem if kind == "jsonl" else entry.name, kind, str(entry),
                               {"skip_malformed": skip_malformed} if kind != "files" else {}))
        except ValueError as error:
            problems.append(f"{entry.name}: {error}")
    from gradfuse.sources import IngestError, SourceError

    ws = _workspace(config, workspace)
    built = unchanged = 0
    for spec in specs:
        declared = _declared_elsewhere(ws, spec)
        if declared:
            problems.append(f"{spec.name}: {declared}")
            continue
        try:
            report = ws.index(spec)
        except (SourceError, IngestError, ValueError) as error:
            problems.append(f"{spec.name}: {error}")
            continue
        built, unchanged = built + (report.status == "built"), unchanged + (report.status == "unchanged")
        if report.notes or report.skipped or any(report.ingest.values()):
            _print_build(report)
    console.print(f"[green]{built + unchanged} sources[/] from {escape(str(folder))}: {built} built, {unchanged} "
                  "unchanged")
    for problem in problems:
        console.print(f"[red]not built[/] {escape(problem)}")
    if problems:
        raise typer.Exit(1)


@index_app.command("files")
def index_files(
    folder: Path,
    source: SourceName,
    chunk_words: int = 200,
    chunk_overlap: int = 40,
    links_outside: Annotated[bool, typer.Option(help="Also index files behind links that lead out of the folder "
                                                     "(skipped and reported by default)")] = False,
    hidden: Annotated[bool, typer.Option(help="Also index hidden files and folders (.git, .venv, .env) and "
                                              "node_modules (skipped and reported by default)")] = False,
    gitignore: Annotated[bool, typer.Option(help="Skip what the folder's .gitignore files exclude")] = True,
    max_file_mb: Annotated[int, typer.Option(help="Skip a larger file")] = LIMITS["max_file_mb"],
    max_pages: Annotated[int, typer.Option(help="Skip a PDF or deck with more pages or slides")] = LIMITS["max_pages"],
    max_rows: Annotated[int, typer.Option(help="Skip a spreadsheet with more rows")] = LIMITS["max_rows"],
    max_unzipped_mb: Annotated[int, typer.Option(
        help="Skip an Office file whose parts unzip to more (a zip bomb)")] = LIMITS["max_unzipped_mb"],
    max_zip_entries: Annotated[int, typer.Option(
        help="Skip an Office file with more parts in its zip")] = LIMITS["max_zip_entries"],
    deadline_s: Annotated[float, typer.Option(help="Skip a file not parsed within this time")] = LIMITS["deadline_s"],
    max_text_mb: Annotated[int, typer.Option(
        help="Skip a file that produces more text (all its chunks)")] = LIMITS["max_text_mb"],
    max_chunks: Annotated[int, typer.Option(help="Skip a file that makes more chunks")] = LIMITS["max_chunks"],
    max_worker_mb: Annotated[int, typer.Option(
        help="Memory of the process that parses; a file that needs more is skipped")] = LIMITS["max_worker_mb"],
    max_page_chars: Annotated[int, typer.Option(
        help="Cut a PDF page's text at this many characters")] = LIMITS["max_page_chars"],
    max_cell_chars: Annotated[int, typer.Option(
        help="Cut a table cell's text at this many characters")] = LIMITS["max_cell_chars"],
    max_columns: Annotated[int, typer.Option(help="Leave out a table row's cells after this many")] = LIMITS["max_columns"],
    max_header_chars: Annotated[int, typer.Option(
        help="Cut what every chunk repeats (a table's header row, headings, a title) at this many characters"
    )] = LIMITS["max_header_chars"],
    max_ocr_megapixels: Annotated[int, typer.Option(
        help="Render a page for OCR at most this large (larger pages below 300 dpi)")] = LIMITS["max_ocr_megapixels"],
    ocr: Annotated[bool, typer.Option(help="Read PDF pages without a text layer with Tesseract "
                                           "(apt-get install tesseract-ocr; pip install 'gradfuse[ocr]')")] = False,
    into: Into = None,
    table: TableName = None,
    language: Language = None,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
    wait: Wait = False,
    ray: RayBuild = None,
):
    """A folder of files: .txt, .md, .html, .pdf, .docx, .pptx, .xlsx, .csv (by content where the extension lies),
    cut into overlapping chunks inside each page, section, slide or sheet, which keep where they stand."""
    given = locals()
    limits = {name: given[name] for name in LIMITS}
    options = {"chunk_words": chunk_words, "chunk_overlap": chunk_overlap,
               **{k: v for k, v in limits.items() if v != LIMITS[k]},
               **({"links_outside": True} if links_outside else {}), **({"hidden": True} if hidden else {}),
               **({} if gitignore else {"gitignore": False})}
    _index(config, workspace, _spec(source, "files", str(folder), options), into, table, language, wait, ray)


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
    _index(config, workspace, _spec(source, "run", str(run), options), wait=wait)


@app.command()
def build(config: ConfigOpt = None, workspace: WorkspaceOpt = None, ray: RayBuild = None):
    """Build every source declared in the config file (unchanged ones are skipped)."""
    from gradfuse.embedding.ray_batches import BuildSettings
    from gradfuse.indexing.report import BuildsFailed
    from gradfuse.redact import redact

    ws = _workspace(config, workspace)
    if ray:
        ws.config.build = BuildSettings(ray_address=ray)
    def build_all() -> list[BuildReport]:
        try:
            return ws.build_configured(progress=True)
        except BuildsFailed as failures:
            return failures.reports

    reports = _run_guarded(build_all)
    for report in reports:
        _print_build(report)
    failed = [report for report in reports if report.status == "failed"]
    if failed:  # every source was tried; the failures again at the end, where they are seen
        console.print(f"[bold red]error:[/] {len(failed)} of {len(reports)} source(s) failed to build "
                      "(their published versions are unchanged):")
        for report in failed:
            console.print(f"  {escape(report.name)}: {escape(redact(report.error))}")
        raise typer.Exit(1)


@app.command()
def summarize(
    source: Annotated[Optional[list[str]], typer.Option("--source", "-s", help="A source to summarise (repeat; "
                                                                                "default: every one)")] = None,
    config: ConfigOpt = None, workspace: WorkspaceOpt = None,
):
    """Make the routing summaries of the sources an engine, a database or another gradfuse holds, from a sample
    read through their own client (built sources have theirs from the build). Routing makes a missing one on its
    own in the background, asking the source every time until then: this makes them now."""
    ws = _workspace(config, workspace)
    names = _run_guarded(lambda: ws.catalog.resolve(source))
    outcome = _run_guarded(lambda: ws.catalog.summaries.make(names))
    for name in names:
        if name not in outcome:
            console.print(f"[green]{escape(name)}[/]: built here, summarised by its build")
        elif outcome[name]:
            console.print(f"[yellow]{escape(name)}[/]: {escape(outcome[name])}")
        else:
            console.print(f"[green]{escape(name)}[/]: summarised")


@app.command()
def sources(config: ConfigOpt = None, workspace: WorkspaceOpt = None,
            as_json: Annotated[bool, typer.Option("--json")] = False):
    """Each built source: kind, documents, index size, encoder, when it was built (or why it cannot be read)."""
    from gradfuse.schemas import source_record

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
