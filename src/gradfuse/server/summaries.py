"""GET /sources/NAME/summary: a source's summary, for another gradfuse that routes questions to this one (its
`kind = "gradfuse"` source reads it, sources/gradfuse_remote.py)."""

from __future__ import annotations

from fastapi import HTTPException

from gradfuse.access import Principal
from gradfuse.checked import check_source_name
from gradfuse.workspace import Workspace


def served_summary(workspace: Workspace, name: str, principal: Principal) -> dict:
    """Only to a key that may read every document of it: its sampled passages' vectors are of any document."""
    check_source_name(name)
    # a source unknown, or that the key may not read: UnknownSource, which the error handlers answer with 422
    workspace.catalog.resolve([name], principal)
    if not principal.every_document:
        raise HTTPException(404, f"source {name} has no summary for this key: it is served to keys that may read "
                                 "every document (every_document = true)")
    summary, why = workspace.catalog.summaries.get(name)
    if summary is None:
        raise HTTPException(404, f"source {name} has no summary: {why}")
    return summary.wire(workspace.config.encoder)
