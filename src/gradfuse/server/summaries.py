"""GET /sources/NAME/summary: a source's summary, for another gradfuse that routes questions to this one (its
`kind = "gradfuse"` source reads it, sources/gradfuse_remote.py)."""

from __future__ import annotations

from fastapi import HTTPException

from gradfuse.sources.base import check_source_name
from gradfuse.workspace import Workspace


def served_summary(workspace: Workspace, name: str) -> dict:
    check_source_name(name)
    workspace.catalog.resolve([name])  # an unknown one: UnknownSource, which the error handlers answer with 422
    summary, why = workspace.catalog.summaries.get(name)
    if summary is None:
        raise HTTPException(404, f"source {name} has no summary: {why}")
    return summary.wire(workspace.config.encoder)
