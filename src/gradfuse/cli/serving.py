"""`gradfuse serve` and `gradfuse mcp`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gradfuse.cli.common import ConfigOpt, WorkspaceOpt, _fail, _run_guarded, _workspace, app, console
from gradfuse.cli.watching import print_synced, print_watching, workspace_watcher


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="Interface to bind (default 127.0.0.1, or [server] host)")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (default 8321, or [server] port)")] = None,
    preload_lm: Annotated[bool, typer.Option(help="Load the scoring LM and generator at start, not on first use")] = False,
    log_level: str = "info",
    insecure_no_key: Annotated[bool, typer.Option(
        help="Serve beyond loopback without an API key (anyone who can reach the port can use it)")] = False,
    watch: Annotated[bool, typer.Option(help="Keep the folder sources current while serving (as `gradfuse "
                                             "watch`): answers come from each change once it is published")] = False,
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
):
    """HTTP API (/search, /ask, /sources, /healthz, /docs) and the web page at /, over this workspace."""
    from dataclasses import replace

    from gradfuse.server.app import serve as run_server

    from gradfuse.access.keys import keys_required
    from gradfuse.execute import make_executor

    ws = _workspace(config, workspace)
    settings = ws.config.server
    settings = replace(settings, host=host or settings.host, port=port if port is not None else settings.port)
    keyed = keys_required(settings.resolved_api_key(), ws.config.access)
    key = "API key required (X-API-Key)" if keyed else "no API key"
    if not keyed and not _loopback(settings.host) and not insecure_no_key:
        # Without a key only the Host check stands, and a client anywhere can send "Host: localhost".
        _fail(f"refusing to serve on {settings.host} without an API key: set GRADFUSE_API_KEY, or pass "
              "--insecure-no-key if every machine that can reach this port may use it")
    if settings.ray:
        ws.executor = _run_guarded(lambda: make_executor(settings.ray, replicas=settings.ray_replicas or None))
    console.print(f"gradfuse serving {ws.root} on http://{settings.host}:{settings.port}/ ({key}; "
                  f"API docs at /docs; OpenAI-compatible at /v1, MCP at /mcp; stage 2 scores in "
                  f"{ws.executor.describe()})")
    watcher = workspace_watcher(ws, print_synced) if watch else None
    if watch and watcher is None:
        _fail("--watch: no folder source to watch (declare one with kind = \"files\", or index one with "
              "`gradfuse index files FOLDER`)")
    if watcher is not None:
        watcher.start()
        print_watching(watcher)
    try:
        run_server(ws, settings, preload_lm=preload_lm, log_level=log_level)
    finally:
        if watcher is not None:
            watcher.stop()


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
