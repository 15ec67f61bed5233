"""`gradfuse key add`: a new key for a principal, written to a key file as its SHA-256 (docs/access.md)."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Annotated

import tomlkit
import typer

from gradfuse.access.keys import AccessError, key_hash, read_key_file
from gradfuse.cli.common import _fail, app, console

key_app = typer.Typer(help="Keys of the server's principals (who may read which sources and documents).",
                      no_args_is_help=True)
app.add_typer(key_app, name="key")


@key_app.command("add")
def add_key(
    name: Annotated[str, typer.Argument(help="The principal: a name that documents' readers may list")],
    sources: Annotated[str, typer.Option(help="The sources it may read, by comma ('*': every one)")],
    groups: Annotated[str, typer.Option(help="Its groups, by comma (documents' readers may list them)")] = "",
    every_document: Annotated[bool, typer.Option(help="Reads documents whoever they are for (an auditor)")] = False,
    file: Annotated[Path, typer.Option(help="The key file ([access] keys_file)")] = Path("keys.toml"),
):
    """Make a key for NAME, print it once, and keep only its SHA-256 in FILE: a running server reads the file
    again at its next request. A principal already in the file gets a new key (the old one stops working)."""
    file = file.resolve()  # a link's target: the file the server reads
    document = tomlkit.parse(file.read_text()) if file.exists() else tomlkit.document()
    principals = document.setdefault("principals", tomlkit.table(is_super_table=True))
    key = secrets.token_urlsafe(32)
    entry = tomlkit.table()
    entry.update({"key_sha256": key_hash(key), "sources": _listed(sources), "groups": _listed(groups),
                  **({"every_document": True} if every_document else {})})
    principals[name] = entry
    # A file of its own (0600 from the start, never a name another run or a link holds), on disk before it replaces
    # the key file at once: a server never reads half a file. An existing file keeps its mode (its reader).
    descriptor, name = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    written = Path(name)
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
    console.print(f"principal {name} in {file}; its key (shown once, not kept):")
    print(key)


def _listed(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]
