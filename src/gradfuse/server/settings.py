"""How the HTTP service binds, authenticates and limits requests (`[server]` in gradfuse.toml)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gradfuse.checked import FILE_SETTINGS, Count, Depth, NonNegative, Port, Seconds, Text

API_KEY_ENV = "GRADFUSE_API_KEY"


@dataclass(frozen=True)
class ServerSettings:
    __pydantic_config__ = FILE_SETTINGS
    host: Text = "127.0.0.1"  # loopback unless asked: the API has no key by default
    port: Port = 8321
    api_key: Text | None = None  # prefer the environment variable GRADFUSE_API_KEY to a key in a committed file
    cors_origins: tuple[Text, ...] = ()  # CORS is off unless origins are listed
    max_body_bytes: Count = 64 * 1024
    max_query_chars: Count = 8000  # ArguAna's queries (whole arguments) run to 5,500 characters
    max_gold_chars: Count = 2000  # a reference answer (target "gold"); the LM pass's own bound is [rerank] max_pass_tokens
    max_k: Count = 100
    max_n: Count = 50  # candidates in one stage-2 LM pass
    max_depth: Depth = 500  # candidates asked of each source
    max_new_tokens: Count = 512
    max_timeout_s: Seconds = 60.0
    # Requests that need the LM (gradient, gro, loo, loo-greedy, ask) admitted at once, running or waiting; one
    # runs at a time (the model is shared and uses every core), so the rest wait in line and the next is refused
    # with 503 and Retry-After instead of piling up behind a minutes-long queue.
    lm_queue: Count = 8
    # LM passes one request may cost (gradfuse.methods.lm_passes): loo-greedy at n = 10, k = 10 is 56, at n = 50
    # about 1,275, minutes of a CPU for one request.
    max_lm_passes: Count = 64
    # Connections and slow clients (server/limits.py): beyond max_connections a connection is closed unread; a
    # request's line and headers must arrive within header_timeout_s, its body within body_timeout_s (408);
    # an idle kept-alive connection is closed after keep_alive_s.
    max_connections: Count = 256
    # Connections one client address may hold at once (behind a reverse proxy every client shares its address:
    # raise it to max_connections there).
    max_client_connections: Count = 32
    header_timeout_s: Seconds = 10.0
    body_timeout_s: Seconds = 30.0
    keep_alive_s: Seconds = 5.0
    # MCP sessions open at /mcp at once (a handshake-era client's; each holds a server task and its streams, and
    # the SDK's own bound is 10,000 for 30 minutes): past it a new session is refused with 503 until one ends or has
    # been idle (no request, no open stream) for mcp_idle_timeout_s, which closes it.
    max_mcp_sessions: Count = 100
    # Of them, one key may hold this many (server/mcp_sessions.py): one key opening 100 blocked every other's MCP.
    max_mcp_sessions_per_key: Count = 10
    mcp_idle_timeout_s: Seconds = 600.0
    # With no API key, only these Host names may reach the server (besides loopback names and the bound address),
    # so that a web page elsewhere cannot reach a local server through DNS rebinding.
    allowed_hosts: tuple[Text, ...] = ()
    # A Ray cluster ("auto", "HOST:PORT", "ray://HOST:PORT") whose scorer replicas run stage 2's LM passes
    # (gradfuse.execute); empty: this process. ray_replicas 0: one per GPU, or one per node without GPUs.
    ray: Text = ""
    ray_replicas: NonNegative = 0
    # Megabytes of /search and /ask results (their JSON) kept for a repeated request until a source is published
    # again (server/cache.py); 0 keeps none. An answer with five passages is about 30 KB.
    cache_mb: NonNegative = 64

    def __post_init__(self):
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        for name in ("max_body_bytes", "max_query_chars", "max_gold_chars", "max_k", "max_n", "max_depth", "max_new_tokens",
                     "lm_queue", "max_lm_passes", "max_connections", "max_client_connections",
                     "max_mcp_sessions", "max_mcp_sessions_per_key"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_client_connections > self.max_connections:
            raise ValueError("max_client_connections must not be above max_connections")
        if self.ray_replicas < 0:
            raise ValueError("ray_replicas must be 0 (one per GPU or node) or more")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "mcp_idle_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be above 0")

    def trusted_hosts(self) -> list[str]:
        return sorted({"localhost", "127.0.0.1", "::1", "[::1]", self.host, *self.allowed_hosts})

    def resolved_api_key(self) -> str | None:
        return os.environ.get(API_KEY_ENV) or self.api_key or None  # "" is no key: the Host check stays
