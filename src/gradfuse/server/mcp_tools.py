"""gradfuse as an MCP server, on the official `mcp` SDK: the tools `search`, `ask` and `list_sources`, and every
passage of a gradfuse index as the resource `gradfuse://SOURCE/DOC_ID`, so that a client can open what an answer
cites. `gradfuse mcp` serves it over stdio; `gradfuse serve` mounts its streamable-HTTP transport at /mcp, behind
the server's key (X-API-Key or a bearer token) like every other path. A call is held to the JSON API's limits and,
on a server, waits in the same LM line."""

from __future__ import annotations

import functools
import inspect
import logging
from urllib.parse import quote

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.mcpserver.resources.templates import ResourceSecurity
from pydantic import ValidationError

from gradfuse import __version__
from gradfuse.access import EVERYTHING, Principal
from gradfuse.generate.openai_http import EndpointError
from gradfuse.methods import LM_METHODS, METHOD_CHOICES
from gradfuse.redact import redact
from gradfuse.schemas import (answer_outcome, answer_record, candidate_record, citations_and_evidence,
                              failure_record, served_source_record)
from gradfuse.server.admission import Busy, LMAdmission
from gradfuse.server.requests import AskRequest, SearchRequest, error_line, field_errors
from gradfuse.server.settings import ServerSettings
from gradfuse.server.streams import Recorder, finished_answer, start_answer, unrecorded
from gradfuse.checked import check_source_name
from gradfuse.sources.base import SourceError
from gradfuse.federation.federated import AllSourcesFailed
from gradfuse.workspace import Workspace

INSTRUCTIONS = ("Searches and answers over this gradfuse workspace's sources at once, choosing the sources per "
                "question. Cite passages by their resource URI (gradfuse://SOURCE/DOC_ID) and read one to check it.")


def resource_uri(source: str, doc_id: str) -> str:
    return f"gradfuse://{source}/{quote(doc_id, safe='')}"


def _passage(number: int, candidate) -> dict:
    record = candidate_record(candidate).model_dump(mode="json")
    return {"number": number, **record, "resource": resource_uri(candidate.source, candidate.doc_id)}


_TOLD = (ValueError, SourceError, Busy, AllSourcesFailed, EndpointError)


def _told_as(error: Exception) -> ToolError:
    return ToolError(redact(getattr(error, "public", None) or str(error), environment=False))


def _told(tool):
    """A call's own failure (a limit, an unknown source or method, a full LM line, every source failed) told to the
    client in words it can act on, redacted, instead of the SDK's bare "Error executing tool"."""
    if inspect.iscoroutinefunction(tool):
        @functools.wraps(tool)
        async def waited(*args, **kwargs):
            try:
                return await tool(*args, **kwargs)
            except _TOLD as error:
                raise _told_as(error) from None

        return waited

    @functools.wraps(tool)
    def call(*args, **kwargs):
        try:
            return tool(*args, **kwargs)
        except _TOLD as error:
            raise _told_as(error) from None

    return call


class _PlainErrors(MCPServer):
    """The SDK tells a client of arguments of the wrong type ("k": "abc") with pydantic's whole dump (its input,
    type and URL): here they are told like every other refusal, the argument and what is wrong with it."""

    async def call_tool(self, name, arguments, context=None):
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            if isinstance(error.__cause__, ValidationError):
                raise ToolError(f"{name}: {error_line(field_errors(error.__cause__.errors()))}") from None
            raise


def build_mcp(workspace: Workspace, settings: ServerSettings, admission: LMAdmission | None = None,
              recorded: Recorder = unrecorded, *, served: bool = False) -> MCPServer:
    """`recorded`: how a server records what each search saw of its sources (/sources, /metrics). `served`: over
    the server's HTTP, where each call reads what its request's key may read; over stdio the local user reads
    everything, as the CLI does."""
    config = workspace.config

    def principal(ctx: Context) -> Principal:
        if not served:
            return EVERYTHING
        request = getattr(ctx.request_context, "request", None)
        found = getattr(getattr(request, "state", None), "principal", None)
        if found is None:  # never over the server's HTTP, whose middleware sets it: refused, never everything
            raise ToolError("this call carries no key")
        return found
    admission = admission or LMAdmission(settings.lm_queue)
    # The SDK configures the root logger at INFO (logging.basicConfig), which would print every library's INFO
    # lines, httpx's request URLs among them, past gradfuse's redaction: the root logger is put back as it was.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    server = _PlainErrors("gradfuse", version=__version__, instructions=INSTRUCTIONS)
    root.handlers[:], root.level = handlers, level

    @server.tool(description="Search every source (or those named) for passages on `query`; each passage comes with "
                             "its source, document id, place in its file, scores and resource URI, and the sources "
                             "that failed are listed. Cost: milliseconds with the default method "
                             f"({config.method}); seconds on a CPU with a scoring-LM method ({', '.join(LM_METHODS)}). "
                             f"method: {METHOD_CHOICES}.")
    @_told
    def search(query: str, ctx: Context, sources: list[str] | None = None, method: str | None = None,
               k: int | None = None) -> dict:
        request = SearchRequest.from_client(query=query, sources=sources, method=method, k=k)
        request.check_limits(settings, config)
        reader = principal(ctx)
        with admission.slot((method or config.method) in LM_METHODS, reader):
            result = recorded(lambda: workspace.search(query, k=request.k, principal=reader,
                                                       **request.search_options()))
        return {"method": result.method, "passages": [_passage(n, c) for n, c in enumerate(result.candidates, 1)],
                "failures": [failure_record(f).model_dump(mode="json") for f in result.failures]}

    @server.tool(description="Answer `question` from the sources, citing passages by number [n]: the answer, its "
                             "citations (source, document, place, resource URI, and the sentences quoted from each), "
                             "the evidence sentences with their spans, whether it abstained (not found), and the "
                             "sources that failed. Cost: about a second on a CPU when the answer is quoted (the "
                             "bundled model); more when a generator writes it or the method runs the scoring LM.")
    @_told
    async def ask(question: str, ctx: Context, sources: list[str] | None = None, method: str | None = None,
                  k: int | None = None) -> dict:
        request = AskRequest.from_client({"query": "question"}, query=question, sources=sources, method=method, k=k)
        request.check_limits(settings, config)
        # Stepped in a worker thread: a call the client cancels stops at the next piece and gives its place in
        # the LM line back, instead of generating on to its end.
        events, _, release = await start_answer(workspace, admission, recorded, request, principal(ctx))
        record = answer_record(await finished_answer(events, release))
        cited = citations_and_evidence(record)
        for citation in cited["citations"]:
            citation["resource"] = resource_uri(citation["source"], citation["doc_id"])
        return {"answer": record.answer, **cited, **answer_outcome(record)}

    @server.tool(description="The sources: name, kind, documents, size, encoder, last build, and whether each opens "
                             "(its error if not). Cost: milliseconds.")
    def list_sources(ctx: Context) -> dict:
        return {"sources": [served_source_record(name, stats, error).model_dump(mode="json")
                            for name, stats, error in workspace.source_health(principal=principal(ctx))]}

    # A doc id is a key in the source's own store, never a path: the SDK's path checks do not apply to it.
    @server.resource("gradfuse://{source}/{+doc_id}", name="passage", mime_type="text/plain",
                     description="A passage of a gradfuse index by its source and document id (percent-encoded)",
                     security=ResourceSecurity(exempt_params={"doc_id"}))
    def passage(source: str, doc_id: str, ctx: Context) -> str:
        reader = principal(ctx)
        # a disabled source stays closed; one the key may not read is told as one that does not exist
        if check_source_name(source) not in workspace.source_names() or not reader.may_read_source(source):
            raise ResourceError(f"this workspace has no source {source!r}")
        with workspace.holding(source) as opened:
            if not hasattr(opened, "document"):
                raise ResourceError(f"source {source!r} is served by {opened.kind}: open its passages there")
            found = opened.document(doc_id, readers=reader.readers)
        if found is None:  # as where the key may not read it
            raise ResourceError(f"source {source!r} has no document {doc_id!r}")
        where = found.location.describe() if found.location else ""
        return "\n".join([*(line for line in (found.title, where) if line), "", found.text])

    return server
