"""gradfuse's MCP server through the official `mcp` client: over stdio (`gradfuse mcp`, its own process) and over
streamable HTTP on a live `gradfuse serve` (keyed): the tools listed and called, a cited passage read back as a
resource, a wrong key refused, a source that fails during a call named in the tool's result, and sessions past
[server] max_mcp_sessions refused until idle ones are closed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import ASTRONOMY, COOKING, write_jsonl
from live_server import Scraped, gradfuse_serve, serving

from gradfuse import SourceSpec, Workspace
from gradfuse.server import API_KEY_ENV
from gradfuse.server.app import create_app
from gradfuse.server.settings import ServerSettings

mcp = pytest.importorskip("mcp")
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

KEY = "mcp-key-for-tests"
QUESTION = "Which planet has the moons Phobos and Deimos?"
# A handshake-era client's first request, as a client that opens a session and leaves it sends it
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
STREAMABLE = {"Accept": "application/json, text/event-stream"}
PYDANTIC_INTERNALS = ("pydantic", "type=", "input_value", "validation error for")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Two built sources and a third that is a gradfuse server nobody runs (it fails on every call)."""
    root = tmp_path_factory.mktemp("mcp")
    (root / "gradfuse.toml").write_text('workspace = "ws"\n\n[sources.team]\nkind = "gradfuse"\n'
                                        'url = "http://127.0.0.1:9"\ntimeout_s = 2\n')
    ws = Workspace.open(root / "gradfuse.toml")
    ws.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(root / "a.jsonl", ASTRONOMY))))
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(root / "c.jsonl", COOKING))))
    return root


def _data(result) -> dict | list:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


async def _exercise(client) -> dict:
    """Every tool and a resource, as an agent would use them."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    found = _data(await client.call_tool("search", {"query": QUESTION, "method": "select", "k": 3}))
    answered = _data(await client.call_tool("ask", {"question": QUESTION}))
    sources = _data(await client.call_tool("list_sources", {}))
    opened = await client.read_resource(found["passages"][0]["resource"])
    return {"tools": tools, "found": found, "answered": answered, "sources": sources,
            "opened": opened.contents[0].text}


def _check(seen: dict) -> None:
    assert set(seen["tools"]) == {"search", "ask", "list_sources"}
    assert "Cost" in seen["tools"]["search"].description and "Cost" in seen["tools"]["ask"].description
    top = seen["found"]["passages"][0]
    assert top["doc_id"] in ("mars", "mars-copy") and top["resource"].startswith("gradfuse://")
    assert [f["source"] for f in seen["found"]["failures"]] == ["team"]  # failed during the call, named
    assert "Phobos" in seen["opened"]
    answered = seen["answered"]
    assert "Phobos" in answered["answer"] and answered["citations"][0]["quotes"]
    assert answered["citations"][0]["resource"].startswith("gradfuse://")
    assert [f["source"] for f in answered["failures"]] == ["team"]
    assert {s["name"] for s in seen["sources"]["sources"]} == {"astronomy", "cooking", "team"}


def test_the_mcp_server_over_stdio(folder):
    server = StdioServerParameters(command=str(Path(sys.executable).with_name("gradfuse")),
                                   args=["mcp", "--config", str(folder / "gradfuse.toml")],
                                   env={k: v for k, v in os.environ.items() if k.startswith(("HF_", "TRANSFORMERS_"))},
                                   cwd=str(folder))

    async def run():
        async with Client(server, read_timeout_seconds=120) as client:
            return await _exercise(client)

    _check(asyncio.run(run()))


def test_the_mcp_server_over_http_on_gradfuse_serve_with_its_key(folder):
    with gradfuse_serve(folder / "ws", "--config", str(folder / "gradfuse.toml"), env={API_KEY_ENV: KEY}) as url:
        async def run(key: str):
            transport = streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(
                headers={"Authorization": f"Bearer {key}"}))
            async with Client(transport, read_timeout_seconds=120) as client:
                return await _exercise(client)

        _check(asyncio.run(run(KEY)))
        metric = Scraped(url, **{"X-API-Key": KEY})  # MCP's search and ask are counted like the JSON API's
        assert metric("gradfuse_source_failures_total", source="team", reason="error") == 2
        assert metric("gradfuse_source_search_seconds_count", source="astronomy") == 2
        with pytest.raises(BaseException) as refused:  # the SDK raises its error inside its task groups
            asyncio.run(run("not-the-key"))
        assert "Server returned an error response" in repr(refused.value)
        # what the client was told: 401 before its body was read, for the MCP path as for every other
        assert httpx.post(f"{url}/mcp", json={}, headers={"Authorization": "Bearer not-the-key"}).status_code == 401


def test_mcp_sessions_past_max_mcp_sessions_are_refused_and_an_idle_one_is_closed(workspace):
    """Sessions are the handshake-era protocol's (mode="legacy"); the 2026 protocol's requests open none."""
    settings = ServerSettings(max_mcp_sessions=2, mcp_idle_timeout_s=1.0)
    with serving(create_app(workspace, settings)) as url:
        def session():
            return Client(streamable_http_client(f"{url}/mcp"), mode="legacy")

        async def run():
            async with session() as first, session() as second:
                with pytest.raises(BaseException) as third:  # the SDK raises its error inside its task groups
                    async with session():
                        pass
                assert "Too many open sessions" in repr(third.value)
                refused = httpx.post(f"{url}/mcp", json=INITIALIZE, headers=STREAMABLE)
                assert refused.status_code == 503 and "Too many open sessions" in refused.text
                for client in (first, second):  # the sessions already open go on
                    assert {tool.name for tool in (await client.list_tools()).tools} >= {"search", "ask"}

        asyncio.run(asyncio.wait_for(run(), timeout=60))
        # Two sessions left open without a request in flight: the bound again, until they are closed as idle.
        for _ in range(2):
            assert httpx.post(f"{url}/mcp", json=INITIALIZE, headers=STREAMABLE).status_code == 200
        assert httpx.post(f"{url}/mcp", json=INITIALIZE, headers=STREAMABLE).status_code == 503
        deadline = time.monotonic() + 10
        while httpx.post(f"{url}/mcp", json=INITIALIZE, headers=STREAMABLE).status_code == 503:
            assert time.monotonic() < deadline, "idle sessions were not closed"
            time.sleep(0.2)


def test_a_tools_refused_arguments_are_named_as_the_tool_names_them_without_pydantics_dump(workspace):
    with serving(create_app(workspace, ServerSettings())) as url:
        async def run():
            async with Client(streamable_http_client(f"{url}/mcp")) as client:
                return [await client.call_tool(tool, arguments) for tool, arguments in (
                    ("ask", {"question": "q" * 9000}), ("ask", {"question": "moons", "k": 0}),
                    ("search", {"query": "moons", "sources": []}), ("ask", {"question": "moons", "k": "abc"}),
                    ("search", {"query": 5}))]

        long, zero, no_sources, text_k, number_query = [
            result.content[0].text for result in asyncio.run(asyncio.wait_for(run(), 60))]
    assert long.endswith("ask: question is 9000 characters; this server accepts at most 8000")  # the SDK's prefix
    assert zero.endswith("ask: k: Input should be greater than or equal to 1")
    assert no_sources.endswith("search: sources: List should have at least 1 item after validation, not 0")
    # wrong types, which the SDK checks before gradfuse sees the call (review of round 5: pydantic's dump came back)
    assert text_k == "ask: k: Input should be a valid integer, unable to parse string as an integer"
    assert number_query == "search: query: Input should be a valid string"
    assert not any(word in text for text in (long, zero, no_sources, text_k, number_query)
                   for word in PYDANTIC_INTERNALS)


def test_one_key_cannot_take_every_mcp_session_nor_use_another_keys(tmp_path, monkeypatch):
    """Issue 58 M3 and L2: 100 sessions opened by bob's key blocked alice's MCP for 10 minutes, and a session id
    was usable and closable by any key."""
    monkeypatch.setenv("ALICE_MCP_KEY", "alice-secret")
    monkeypatch.setenv("BOB_MCP_KEY", "bob-secret")
    (tmp_path / "gradfuse.toml").write_text(
        'workspace = "ws"\n[access.principals.alice]\nkey_env = "ALICE_MCP_KEY"\nsources = ["*"]\n'
        '[access.principals.bob]\nkey_env = "BOB_MCP_KEY"\nsources = ["*"]\n')
    ws = Workspace.open(tmp_path / "gradfuse.toml")
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(tmp_path / "c.jsonl", COOKING))))
    settings = ServerSettings(max_mcp_sessions=4, max_mcp_sessions_per_key=2)
    alice, bob = ({**STREAMABLE, "X-API-Key": key} for key in ("alice-secret", "bob-secret"))
    with serving(create_app(ws, settings)) as url:
        opened = [httpx.post(f"{url}/mcp", json=INITIALIZE, headers=bob) for _ in range(2)]
        assert [r.status_code for r in opened] == [200, 200]
        refused = httpx.post(f"{url}/mcp", json=INITIALIZE, headers=bob)
        assert refused.status_code == 429 and "max_mcp_sessions_per_key" in refused.text
        assert httpx.post(f"{url}/mcp", json=INITIALIZE, headers=alice).status_code == 200  # alice still gets in
        bobs = opened[0].headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        assert httpx.post(f"{url}/mcp", json=listing, headers={**alice, "Mcp-Session-Id": bobs}).status_code == 404
        assert httpx.delete(f"{url}/mcp", headers={**alice, "Mcp-Session-Id": bobs}).status_code == 404
        doubled = [*alice.items(), ("Mcp-Session-Id", bobs), ("Mcp-Session-Id", "another")]  # the SDK reads the first
        assert httpx.post(f"{url}/mcp", json=listing, headers=doubled).status_code == 400
        # bob's own session is his to close, and then he may open another
        assert httpx.delete(f"{url}/mcp", headers={**bob, "Mcp-Session-Id": bobs}).status_code in (200, 204)
        assert httpx.post(f"{url}/mcp", json=INITIALIZE, headers=bob).status_code == 200
    ws.close()
