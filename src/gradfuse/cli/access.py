"""`gradfuse key add` and `gradfuse key remove`: the principals of a key file, each key kept as its SHA-256
(docs/access.md)."""

from __future__ import annotations

import fcntl
import os
import secrets
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gradfuse.access import InvalidReader, check_reader
from gradfuse.cli.common import ConfigOpt, _fail, _workspace, app, console, escape

if TYPE_CHECKING:
    import tomlkit

key_app = typer.Typer(help="Keys of the server's principals (who may read which sources and documents).",
                      no_args_is_help=True)
app.add_typer(key_app, name="key")

KeyFile = Annotated[Optional[Path], typer.Option(
    help="The key file (default: the config's [access] keys_file, else ./keys.toml)")]


@key_app.command("add")
def add_key(
    name: Annotated[str, typer.Argument(help="The principal: a name that documents' readers may list")],
    sources: Annotated[str, typer.Option(help="The sources it may read, by comma ('*': every one)")],
    groups: Annotated[str, typer.Option(help="Its groups, by comma (documents' readers may list them)")] = "",
    every_document: Annotated[bool, typer.Option(help="Reads documents whoever they are for (an auditor)")] = False,
    file: KeyFile = None,
    config: ConfigOpt = None,
):
    """Make a key for NAME, print it once, and keep only its SHA-256 in the key file: a running server reads the
    file again at its next request. A principal already in the file gets a new key (the old one stops working)."""
    _check_principal(name)
    readable = _listed(sources)
    if not readable:
        _fail("--sources names no source: give the sources it may read, or '*' for every one")
    ws = _workspace(config, None)
    if name in ws.config.access.principals:  # one name with two keys: the server would refuse the whole file
        _fail(f"principal {name!r} is in the config's [access.principals]: its key is set there")
    unknown = [s for s in readable if s != "*" and s not in ws.source_names()]
    if unknown:  # a typo, or a source not built yet: the key reads it once it is
        console.print(f"[yellow]warning:[/] no source {', '.join(map(repr, unknown))} in this workspace yet")
    file = _key_file(file, ws)
    key = secrets.token_urlsafe(32)
    import tomlkit

    from gradfuse.access.keys import key_hash

    entry = tomlkit.table()
    entry.update({"key_sha256": key_hash(key), "sources": readable, "groups": _listed(groups),
                  **({"every_document": True} if every_document else {})})
    with _changing(file) as document:
        document.setdefault("principals", tomlkit.table(is_super_table=True))[name] = entry
    console.print(f"principal {escape(name)} in {escape(str(file))}; its key (shown once, not kept):")
    print(key)


@key_app.command("remove")
def remove_key(
    name: Annotated[str, typer.Argument(help="The principal whose key stops working")],
    file: KeyFile = None,
    config: ConfigOpt = None,
):
    """Take NAME out of the key file: a running server refuses its key from its next request on."""
    file = (file or _key_file(None, _workspace(config, None))).resolve()  # --file: no config to read first
    with _changing(file) as document:
        if name not in document.get("principals", {}):
            _fail(f"{file} has no principal {name!r}")
        del document["principals"][name]
    console.print(f"principal {escape(name)} removed from {escape(str(file))}")


def _check_principal(name: str) -> None:
    try:
        check_reader(name)
    except InvalidReader:
        _fail(f"principal name {name!r}: use 1 to 128 ASCII letters, digits, '_', '.', '@' or '-', starting with a "
              "letter or digit (documents' readers name it)")


def _key_file(given: Path | None, ws) -> Path:
    configured = ws.config.access.keys_file
    if given is None and not configured:
        console.print("[yellow]note:[/] the config names no [access] keys_file: ./keys.toml is read by a server "
                      "only once keys_file names it")
    file = (given or (Path(configured) if configured else Path("keys.toml"))).resolve()  # a link's target
    if not file.parent.is_dir():
        _fail(f"{file.parent} is not a folder")
    return file


@contextmanager
def _changing(file: Path):
    """The key file's document, to change in place, written back whole; one change at a time (a lock beside it):
    two at once would lose one, and a lost removal is a revoked key that works again."""
    import tomlkit

    with open(file.with_name(f".{file.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        document = tomlkit.parse(file.read_text()) if file.exists() else tomlkit.document()
        yield document
        _write(file, document)


def _write(file: Path, document: tomlkit.TOMLDocument) -> None:
    """A file of its own (0600 from the start, never a name another run or a link holds), on disk before it
    replaces the key file at once: a server never reads half a file. An existing file keeps its mode (its reader)."""
    import tomlkit

    from gradfuse.access.keys import AccessError, read_key_file

    descriptor, temporary = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    written = Path(temporary)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(tomlkit.dumps(document))
            handle.flush()
            os.fsync(handle.fileno())
        read_key_file(written)  # the whole file as the server will read it: a bad name is refused here
        if file.exists():
            os.chmod(written, file.stat().st_mode & 0o777)
        os.replace(written, file)
    except AccessError as error:
        _fail(str(error).replace(str(written), str(file)))
    finally:
        written.unlink(missing_ok=True)


def _listed(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]
