"""`gradfuse watch`, and what `serve --watch` shares with it: the workspace's folder sources kept current."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer

from gradfuse.cli.common import ConfigOpt, WorkspaceOpt, _fail, _workspace, app, console, escape

if TYPE_CHECKING:
    from gradfuse.indexing import BuildReport
    from gradfuse.indexing.watch import FolderWatcher, Synced
    from gradfuse.sources import SourceSpec
    from gradfuse.workspace import Workspace

# Defaults None: indexing.watch's DEBOUNCE_S and RESCAN_S, read when the command runs (--help imports no watcher).
Debounce = Annotated[Optional[float], typer.Option(help="Seconds a folder stays quiet before its changes are "
                                                        "published (default 0.5)", show_default=False)]
Rescan = Annotated[Optional[float], typer.Option(help="Seconds between syncs without a file event (the fallback "
                                                      "where none come: network filesystems; default 60)",
                                                 show_default=False)]


def workspace_watcher(ws: Workspace, done: Callable[[Synced], None], *, debounce_s: float | None = None,
                      rescan_s: float | None = None) -> FolderWatcher | None:
    """A watcher of the workspace's folder sources (not started), or None where it has none."""
    from gradfuse.indexing.watch import DEBOUNCE_S, RESCAN_S, FolderWatcher, FollowedSpecs, folder_specs

    specs = folder_specs(ws.root, [s.spec for s in ws.config.sources.values() if s.spec is not None])
    if not specs:
        return None
    followed = FollowedSpecs(ws.root, specs)

    def sync(spec: SourceSpec) -> BuildReport:
        published, seen, encoder = followed.now(spec.name)
        return ws.index(published, wait=True, options_seen=seen, encoder=encoder)

    return FolderWatcher(specs, sync, done=done, ignore=[ws.root],
                         debounce_s=DEBOUNCE_S if debounce_s is None else debounce_s,
                         rescan_s=RESCAN_S if rescan_s is None else rescan_s)


def print_watching(watcher: FolderWatcher) -> None:
    for name, why in watcher.unwatched.items():
        console.print(f"[yellow]{escape(name)}[/]: no file events ({escape(why)}); rescanned every "
                      f"{watcher.rescan_s:g} s")
    console.print(f"watching {len(watcher.sources)} folder source(s): {', '.join(watcher.sources)}")


def print_synced(synced: Synced) -> None:
    if synced.error is not None:
        console.print(f"[red]{escape(synced.name)}[/]: not synced ({escape(synced.error)}); tried again on the "
                      "next change")
        return
    report, files = synced.report, synced.report.files
    if report.status == "built":
        console.print(f"[green]{escape(synced.name)}[/]: published {report.documents} passages in "
                      f"{report.seconds:.2f} s (files: {files['added']} added, {files['changed']} changed, "
                      f"{files['deleted']} deleted; passages embedded: {report.embedded_now})")


@app.command()
def watch(debounce: Debounce = None, rescan: Rescan = None, config: ConfigOpt = None,
          workspace: WorkspaceOpt = None):
    """Keep the folder sources current: each burst of changes (edits, new, renamed and deleted files) is read and
    published as the source's new version, the rest of the folder untouched. Watches the folder sources the config
    declares and those indexed with `gradfuse index files`. Stop with Ctrl-C."""
    ws = _workspace(config, workspace)
    watcher = workspace_watcher(ws, print_synced, debounce_s=debounce, rescan_s=rescan)
    if watcher is None:
        _fail("no folder source to watch: declare one ([sources.NAME] kind = \"files\") or index one with "
              "`gradfuse index files FOLDER`")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with watcher:
        print_watching(watcher)
        console.print("Ctrl-C stops")
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
