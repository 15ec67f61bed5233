"""Request bodies, with the same option names as the CLI, and the configured limits checked with clear messages."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from gradfuse.methods import METHOD_CHOICES, lm_passes
from gradfuse.rerank.base import SIGNALS
from gradfuse.reading.scoring import evidence_passes
from gradfuse.server.settings import ServerSettings
from gradfuse.checked import check_source_name


# A type bound on every count, far above any server's limit: a 400-digit k is a 422, not an OverflowError.
LARGEST = 2**31 - 1


class RequestLimitError(ValueError):
    """A value is well-typed but beyond what this server accepts (or, for a request a tool call or a chat makes,
    not what it accepts at all)."""


# pydantic's words for a string that is no text ("unable to parse raw data as a unicode string") tell a client nothing
_PLAINER = {"string_unicode": "not valid Unicode text (a lone surrogate escape such as \\ud800)"}


def field_errors(errors: list[dict], names: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """pydantic's errors as (the field, by the client's name for it in `names` where it has one; what is wrong):
    a validator's own words where they do not echo the value (`public`), never pydantic's dump of the error (its
    input_value, type and URL)."""
    names, told = names or {}, []
    for error in errors:
        path = [str(part) for part in error.get("loc", ()) if part != "body"]
        if path:
            path[0] = names.get(path[0], path[0])
        public = getattr(error.get("ctx", {}).get("error"), "public", None)
        told.append((".".join(path), public or _PLAINER.get(error["type"]) or error["msg"]))
    return told


def error_line(errors: list[tuple[str, str]]) -> str:
    return "; ".join(f"{field}: {message}" if field else message for field, message in errors)


class SearchRequest(BaseModel):
    # strict: "k": "5" is a wrong type, not a number; unknown keys are typos, not options to ignore silently.
    model_config = ConfigDict(strict=True, extra="forbid")

    query: str = Field(min_length=1, description="free text (no query syntax)")
    method: str | None = Field(None, description=METHOD_CHOICES)
    k: int | None = Field(None, ge=1, le=LARGEST, description="results returned (for /ask: passages given to the generator)")
    sources: list[str] | None = Field(None, min_length=1, description="query only these sources")
    retrieval: Literal["bm25", "dense", "hybrid"] | None = None
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="seconds each source may take")
    depth: int | None = Field(None, ge=1, le=LARGEST, description="candidates asked of each source")
    target: Literal["draft", "gold", "query"] | None = Field(None, description="stage-2 target")
    estimator: Literal["gate", "reader_gate", "grad_x_input"] | None = Field(None, description="stage-2 estimator")
    n: int | None = Field(None, ge=1, le=LARGEST, description="candidates entering the stage-2 LM pass")
    pool: Literal["cosine", "rrf", "combsum-z"] | None = Field(None, description="stage-2 pool and prior")
    scorer: Literal[SIGNALS] | None = Field(None, description="gro's stage-2 signal")
    gold: str | None = Field(None, description="reference answer (needed by target 'gold')")
    # The client's name for a field where it is not the field's own (MCP's `ask` takes the query as `question`)
    _client_names: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def from_client(cls, names: dict[str, str] | None = None, **values):
        """The request a tool call or a chat makes of `values`: every error, a value refused here or a limit,
        names the field as the client sent it (`names`: field → the client's name) and says what is wrong."""
        try:
            request = cls(**values)
        except ValidationError as error:
            raise RequestLimitError(error_line(field_errors(error.errors(), names))) from None
        request._client_names = names or {}
        return request

    def _named(self, field: str) -> str:
        return self._client_names.get(field, field)

    @field_validator("sources")
    @classmethod
    def _names(cls, names: list[str] | None) -> list[str] | None:
        return [check_source_name(name) for name in names] if names is not None else None

    def check_limits(self, limits: ServerSettings, config) -> None:
        """`config`: the workspace's, for the defaults of what the request leaves unset."""
        if not self.query.strip():
            raise RequestLimitError(f"{self._named('query')} is empty (only whitespace)")
        if len(self.query) > limits.max_query_chars:
            raise RequestLimitError(f"{self._named('query')} is {len(self.query)} characters; this server accepts "
                                    f"at most {limits.max_query_chars}")
        if self.gold is not None and len(self.gold) > limits.max_gold_chars:
            raise RequestLimitError(f"{self._named('gold')} is {len(self.gold)} characters; this server accepts "
                                    f"at most {limits.max_gold_chars} (max_gold_chars)")
        for name, limit in (("k", limits.max_k), ("n", limits.max_n), ("depth", limits.max_depth),
                            ("timeout_s", limits.max_timeout_s)):
            value = getattr(self, name)
            if value is not None and value > limit:
                raise RequestLimitError(f"{self._named(name)} = {value:g} is above this server's limit of {limit:g}")
        method, n, k = self.method or config.method, self.n or config.rerank.n, self.k or self.default_k(config)
        evidence = self.evidence_passes(config)
        passes = lm_passes(method, n, k, config.rerank.set_rounds, self.scorer or config.rerank.scorer,
                           config.rerank.prior) + evidence
        if passes > limits.max_lm_passes:
            quoting = f" ({evidence} of them quoting the evidence, [evidence] scorer {config.evidence.scorer})" \
                if evidence else ""
            raise RequestLimitError(f"{method} with n = {n} and k = {k} costs {passes} LM passes{quoting}; this "
                                    f"server allows at most {limits.max_lm_passes} a request (max_lm_passes): "
                                    "lower n or k")

    def evidence_passes(self, config) -> int:
        return 0  # a search quotes no evidence

    @staticmethod
    def default_k(config) -> int:
        return config.k

    def search_options(self) -> dict:
        """Keyword arguments for `Workspace.search` (unset fields keep the workspace's defaults)."""
        rerank = {key: getattr(self, key) for key in ("target", "estimator", "n", "pool", "scorer")
                  if getattr(self, key) is not None}
        return {"method": self.method, "sources": self.sources, "retrieval": self.retrieval,
                "timeout_s": self.timeout_s, "depth": self.depth, "gold": self.gold, **rerank}


class AskRequest(SearchRequest):
    max_new_tokens: int | None = Field(None, ge=1, le=LARGEST)
    stream: bool = Field(False, description="answer as server-sent events: search, token..., answer")

    def evidence_passes(self, config) -> int:
        return evidence_passes(config.evidence)

    def check_limits(self, limits: ServerSettings, config) -> None:
        super().check_limits(limits, config)
        if self.max_new_tokens is not None and self.max_new_tokens > limits.max_new_tokens:
            raise RequestLimitError(f"{self._named('max_new_tokens')} = {self.max_new_tokens} is above this "
                                    f"server's limit of {limits.max_new_tokens}")

    @staticmethod
    def default_k(config) -> int:
        return config.context_k
