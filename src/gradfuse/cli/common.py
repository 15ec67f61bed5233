"""What every `gradfuse` command shares: the app, the console, option types, the workspace, errors as one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape as escape_markup

if TYPE_CHECKING:
    from gradfuse.workspace import Workspace

# The pipeline is imported by the commands that run it, not by the app: `gradfuse --help` and a command's usage
# error need none of it (issue 71).

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
    from gradfuse.checked import check_source_name

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
RayBuild = Annotated[Optional[str], typer.Option("--ray", help="Embed the passages on this Ray cluster (HOST:PORT, "
                                                                  "or auto): see docs/ray.md")]
Wait = Annotated[bool, typer.Option(help="If another process is building this source, wait for it instead of "
                                         "failing")]
TableName = Annotated[Optional[str], typer.Option(help="Table for --into (default: the source name)")]
Language = Annotated[Optional[str], typer.Option(help="Text search configuration for --into (default english)")]


def _workspace(config: Path | None, workspace: Path | None, *, preload_encoder: bool = False) -> Workspace:
    """`preload_encoder`: a command that will embed its question starts loading the encoder first (_preload)."""
    if preload_encoder:
        _preload(config)
    from gradfuse.config import ConfigError
    from gradfuse.workspace import Workspace

    try:
        return Workspace.open(config, workspace=workspace)
    except ConfigError as error:
        _fail(str(error))


def _preload(config: Path | None) -> None:
    """Load the configured query encoder in a thread while the command imports the rest: ONNX Runtime reads the
    model and builds its session outside the GIL, so a cold `search` or `ask` waits for the longer of the two, not
    their sum. A failure is left to the command's own load, which reports it."""
    import threading
    import tomllib

    from gradfuse.embedding.encoder import DEFAULT_ENCODER, load_encoder

    path = config or Path("gradfuse.toml")  # config.py's DEFAULT_CONFIG_NAME, read without importing config.py
    try:
        name = tomllib.loads(path.read_text()).get("encoder", {}).get("model", DEFAULT_ENCODER)
    except (OSError, ValueError, AttributeError):
        name = DEFAULT_ENCODER

    def load() -> None:
        try:
            load_encoder(str(name))
        except Exception:  # noqa: BLE001 - the command loads it again and says why
            pass

    threading.Thread(target=load, name="preload-encoder").start()


def _fail(message: str) -> None:
    from gradfuse.redact import redact

    console.print(f"[bold red]error:[/] {escape(redact(message))}")
    raise typer.Exit(2)


def _run_guarded(action):
    """Turn the library's specific errors into one clear line and exit code 2, instead of a traceback."""
    from gradfuse.config import ConfigError
    from gradfuse.execute import RayUnavailable
    from gradfuse.federation.federated import AllSourcesFailed
    from gradfuse.fusion import UnknownMethod
    from gradfuse.generate.openai_http import EndpointError
    from gradfuse.sources import IngestError, SourceError

    try:
        return action()
    except (SourceError, IngestError, UnknownMethod, AllSourcesFailed, ConfigError, RayUnavailable, EndpointError,
            ValueError) as error:
        _fail(str(error))


Method = Annotated[Optional[str], typer.Option("--method", "-m", "--fusion", help=(
    "How the sources' lists become one ranking: select (the default), rrf, gro, ... (`gradfuse methods` lists "
    "every one)"))]
Sources = Annotated[Optional[list[str]], typer.Option("--source", "-s", help="Query only these sources",
                                                     callback=_source_name)]
Retrieval = Annotated[Optional[str], typer.Option(help="bm25 | dense | hybrid (within each source)")]
Timeout = Annotated[Optional[float], typer.Option("--timeout", help="Seconds each source may take")]
Target = Annotated[Optional[str], typer.Option(help="Stage-2 target: draft | gold | query")]
Estimator = Annotated[Optional[str], typer.Option(help="Stage-2 estimator: gate | reader_gate | grad_x_input")]
Signal = Annotated[Optional[str], typer.Option("--scorer", help=(
    "gro's stage-2 signal (`gradfuse methods` lists them). Default upr: of the signals measured on all three "
    "benchmarks it ranks the held-out queries best (results/stage2/defaults.md); gradient is the paper's"))]
Pool = Annotated[Optional[int], typer.Option("--n", help="Candidates entering the stage-2 LM pass")]
PoolOrder = Annotated[Optional[str], typer.Option("--pool", help="Stage-2 pool and prior: cosine | rrf | combsum-z")]
Gold = Annotated[Optional[str], typer.Option(help="Reference answer (needed by --target gold)")]
Explain = Annotated[bool, typer.Option(help="Show stage 1's decision and each document's prior, stage-2 and final score")]
