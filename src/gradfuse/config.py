"""One TOML file per workspace: where indexes live, which models, defaults, and declared sources.

Example (every key optional)::

    workspace = ".gradfuse"          # index folder, relative to this file
    [defaults]
    method = "select"                # see gradfuse.methods: concat | rrf | combsum[-z] | combmnz[-z] |
                                     # single:<source> | dense | select | gradient | gro | loo | loo-greedy
    k = 10                           # fused results returned
    depth = 20                       # candidates asked of each source
    timeout_s = 10.0                 # per source
    retrieval = "hybrid"             # bm25 | dense | hybrid
    [encoder]
    model = "all-MiniLM-L6-v2"
    [generator]
    model = "smollm2"                # or a HF folder, a .gguf file, an http(s) URL of an OpenAI-compatible server
    max_new_tokens = 128
    context_k = 5                    # passages given to the generator (the lowest-ranked dropped if they do not fit)
    context_tokens = 8192            # an endpoint's window (a local model's is read from the model)
    api_key_env = ""                 # the variable holding an endpoint's key (e.g. "OPENAI_API_KEY"); none sent unless
                                     # named, and never over plain http to another machine
    context = "windows"              # what the generator reads: the best sentences with their neighbours | "passages"
                                     # (whole, the lowest-ranked dropped to fit) | "evidence" (best sentences alone)
    window_tokens = 1024             # the windows' budget (about what 5 passages' first 600 characters took before)
    evidence_tokens = 384            # the budget with context = "evidence" (chosen on dev: results/evidence)
    answer = "auto"                  # extractive (the best evidence sentences are the answer, nothing generated)
                                     # with the bundled generator, else generate; or "generate" | "extractive"
    cite_first = true                # local models must open by naming a passage (see generate/local.py)
    unsupported = "mark"             # a written answer none of whose sentences the passages support: marked, or
                                     # "not_found" (replaced by "Not found in these sources" and what came closest)
    [selection]                      # stage 1 (gradfuse.selection.SelectionSettings; defaults tuned on dev)
    redundancy_weight = 1.0          # lambda: how much a source that copies a chosen one gives way
    redundancy = "copies"            # how redundancy is measured: copies | similarity (topical, the method's)
    threshold = 0.3
    max_sources = 3
    fusion = "dense"                 # how select ranks the chosen sources: rrf | combsum-z | concat | dense
    choice = "hard"                  # hard: keep the chosen sources (issue 73's rule) | soft: weigh each by its gain
    soft_weight = 0.25               # soft: a passage's cosine minus this times its source's gain below the best
    soft_margin = 0.2                # soft: drop a source whose gain is more than this below the best (2: none)
    [rerank]                         # stage 2 (gradfuse.rerank.RerankSettings)
    model = "smollm2"                # white-box scoring LM (local only: gradients are needed)
    scorer = "upr"                   # gro's stage-2 signal: upr (best on the benchmarks) | gradient | attention | ...
    n = 10
    estimator = "reader_gate"        # reader_gate | gate | grad_x_input
    target = "draft"                 # draft | gold | query
    pool = "cosine"                  # cosine | rrf | combsum-z: which ranking picks the n and is their prior
    mix = "zsum"                     # zsum: final = z(score) + prior_weight * z(prior); within: reorder the top m
    prior_weight = 1.0
    within_m = 3
    dtype = "auto"                   # of the passes: auto (bfloat16 where the CPU has it) | float32 | bfloat16
    cross_encoder = ""               # a local CrossEncoder folder, for --method cross-encoder
    max_pass_tokens = 2048           # the longest LM pass (question + target + n documents); beyond it: an error
    [evidence]                       # the sentences an answer quotes (gradfuse.rerank.sentences.EvidenceSettings)
    scorer = "support"               # support | gate | cosine | upr | loo | none
    calibrated = false               # (gate) minus its value under the content-free target "N/A"
    top = 4                          # sentences quoted with each answer
    abstain_below = 0.18             # support below which the answer says "Not found in these sources" (0: never)
    [server]                         # `gradfuse serve` (gradfuse.server.settings.ServerSettings)
    host = "127.0.0.1"
    port = 8321
    cors_origins = []                # CORS stays off unless origins are listed
    max_k = 100                      # also max_body_bytes, max_query_chars, max_gold_chars, max_n, max_depth, max_new_tokens,
    lm_queue = 8                     # max_timeout_s; the API key comes from GRADFUSE_API_KEY (or api_key here)
    max_connections = 256            # beyond it a connection is closed unread
    header_timeout_s = 10.0          # request line and headers; body_timeout_s = 30.0 (408); keep_alive_s = 5.0
    max_mcp_sessions = 100           # at /mcp at once, beyond it 503; mcp_idle_timeout_s = 600.0 closes an idle one
    ray = ""                         # "HOST:PORT" or "auto": stage 2 on a Ray cluster's scorer replicas (docs/ray.md)
    ray_replicas = 0                 # 0: one per GPU, or one per node without GPUs
    cache_mb = 64                    # MB of /search and /ask results kept for a repeated request until a publish
    [guard]                          # each source fails alone (gradfuse.federation.guard.GuardSettings)
    workers = 8                      # threads per source: all held by calls past their deadline, it answers "busy"
    breaker_failures = 5             # failures in a row that open a source's circuit breaker (0: never)
    breaker_cooldown_s = 30.0        # an open breaker's pause before one request probes the source again
    max_passage_chars = 20000        # a longer passage from a source is cut to this (its length kept in cut_from)
    [routing]                        # before retrieval (gradfuse.selection.routing.RoutingSettings)
    above = 32                       # a question that may reach more sources than this is routed
    budget = 24                      # to this many of them, chosen from their summaries
    router = "summary"               # summary | redde
    widen_margin = 0.2               # summary: ask every source within this of the best score too (0: off)
    widen_max = 50                   # ... up to this many sources in all
    max_open = "auto"                # sources held open at once (a quarter of the open-file limit, at most 1,024)
    [access]                         # who may read what (gradfuse.access.keys; docs/access.md)
    keys_file = "keys.toml"          # principals with their keys' SHA-256 (gradfuse key add), read again on change
    [access.principals.alice]
    key_env = "ALICE_KEY"            # or key_sha256 = "..."
    groups = ["hr"]                  # documents' readers name principals and groups
    sources = ["*"]                  # the sources it may read
    [sources.scifact]
    kind = "beir"                    # beir | jsonl | files | run
    path = "../shared/data/beir_scifact"
    weight = 1.0
    timeout_s = 5.0
    retrieval = "bm25"
    [sources.tickets]                # a table in PostgreSQL (gradfuse.sources.postgres.PostgresSettings)
    kind = "postgres"
    url_env = "TICKETS_DB_URL"       # or url = "postgresql://user@host/db" (never a password in this file)
    table = "tickets"                # plus id_column, text_column, title_column, tsv_column, embedding_column,
    language = "english"             # distance (ip | cosine), ef_search, exact, pool_size
    timeout_s = 2.0                  # also the statement timeout of its queries
    [sources.team]                   # another gradfuse server (gradfuse.sources.gradfuse_remote.RemoteSettings)
    kind = "gradfuse"
    url = "http://search.example:8321"
    key_env = "TEAM_GRADFUSE_KEY"    # the variable holding its API key (never the key in this file)
    sources = ["manuals", "tickets"] # its sources to ask (default: all); method = "..." its method (default: its own)
    [sources.notes]                  # a LanceDB table (or kind = "qdrant" with collection = "..."): docs/engines.md
    kind = "lancedb"
    uri = "/data/lance"
    table = "notes"                  # id_field, text_field, title_field, vector_field: the table's own names
    query_encoder = "all-MiniLM-L6-v2"   # the model that embedded it; key_env: the variable holding its key

CLI flags override the file; the file overrides the built-in defaults.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from pydantic import Field, TypeAdapter, ValidationError, with_config

from gradfuse.access.keys import AccessError, AccessSettings, parse_principals
from gradfuse.checked import FILE_SETTINGS, Count, Depth, Flag, Seconds, Text, Weight
from gradfuse.embedding.ray_batches import BuildSettings
from gradfuse.reading.scoring import EvidenceSettings
from gradfuse.rerank import RerankSettings
from gradfuse.selection import SelectionSettings
from gradfuse.selection.routing import RoutingSettings
from gradfuse.server.settings import ServerSettings
from gradfuse.checked import check_source_name
from gradfuse.sources.base import SourceSpec
from gradfuse.sources.engines import ENGINE_KINDS, engine_types
from gradfuse.federation.guard import GuardSettings
from gradfuse.sources.stores import relative_to
from gradfuse.sources.postgres import PostgresSettings, default_table

DEFAULT_CONFIG_NAME = "gradfuse.toml"
_SOURCE_SETTINGS = {"weight", "timeout_s", "retrieval", "enabled"}
_SOURCE_BUILD = {"kind", "path"}


class ConfigError(ValueError):
    pass


@dataclass
class SourceSettings:
    weight: float = 1.0
    timeout_s: float | None = None
    retrieval: str | None = None
    enabled: bool = True
    spec: SourceSpec | None = None  # present when the file says how to build the source
    postgres: PostgresSettings | None = None  # present for a source that is a PostgreSQL table
    engine: object | None = None  # present for a source an engine serves: its kind's settings (sources/engines.py)


@dataclass
class Config:
    workspace: Path = Path(".gradfuse")
    # The method the benchmarks' rule chose (results/defaults/method.md): the best held-out quality among the methods
    # that answer within a second on two cores.
    method: str = "select"
    k: int = 10
    depth: int = 20
    timeout_s: float = 10.0
    retrieval: str = "hybrid"
    encoder: str = "all-MiniLM-L6-v2"
    generator: str = "smollm2"
    max_new_tokens: int = 128
    context_k: int = 5
    context_tokens: int = 8192
    api_key_env: str = ""
    # What the generator reads (reading/context.py): windows around the evidence, whole passages, or the evidence
    # sentences alone. Windows: their token budget is about what the prompt spent before issue 70 (five passages'
    # first 600 characters), now spent where the evidence is.
    context: str = "windows"
    window_tokens: int = 1024
    # With context "evidence": the sentences' token budget. Chosen on the dev questions of HotpotQA and TAT-QA
    # (results/evidence/budget.md): no budget kept 95% of the passages' answer-in-context, the largest tried is kept.
    evidence_tokens: int = 384
    # "auto": extractive with the bundled 135M generator (results/evidence: its generated answers held the gold
    # answer less than half as often as the quoted sentences did), generated with any other; or "generate" |
    # "extractive".
    answer: str = "auto"
    cite_first: bool = True
    # A written answer whose sentences find no support in the passages (reading/attribution.py): "mark" (the JSON's,
    # the page's and /v1's `unsupported`) or "not_found" (its text replaced as an abstained answer's).
    unsupported: str = "mark"
    sources: dict[str, SourceSettings] = field(default_factory=dict)
    selection: SelectionSettings = field(default_factory=SelectionSettings)
    rerank: RerankSettings = field(default_factory=RerankSettings)
    evidence: EvidenceSettings = field(default_factory=EvidenceSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    guard: GuardSettings = field(default_factory=GuardSettings)
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    access: AccessSettings = field(default_factory=AccessSettings)  # who may read what (docs/access.md)
    build: BuildSettings = field(default_factory=BuildSettings)  # where a build embeds (docs/ray.md)

    def settings(self, source: str) -> SourceSettings:
        return self.sources.get(source, SourceSettings())


def load_config(path: Path | str | None = None, *, workspace: Path | str | None = None) -> Config:
    """Read `path` (or ./gradfuse.toml when it exists); `workspace` overrides the file's index folder."""
    if path is None and Path(DEFAULT_CONFIG_NAME).is_file():
        path = DEFAULT_CONFIG_NAME
    config = Config() if path is None else _parse(Path(path))
    if workspace is not None:
        config.workspace = Path(workspace)
    return config


def _parse(path: Path) -> Config:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"config file {path} does not exist") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}") from error
    base = path.resolve().parent
    workspace = _checked(Text, raw.pop("workspace", ".gradfuse"), f"{path}: workspace")
    config = Config(workspace=base / workspace)
    for section, keys in (("defaults", _Defaults), ("generator", _Generator)):
        values = _checked(keys, raw.pop(section, {}), f"{path} [{section}]")
        if "model" in values:
            config.generator = values.pop("model")
        for key, value in values.items():
            setattr(config, key, float(value) if isinstance(getattr(config, key), float) else value)
    for section, settings_type in (("selection", SelectionSettings), ("rerank", RerankSettings),
                                   ("evidence", EvidenceSettings), ("server", ServerSettings),
                                   ("guard", GuardSettings), ("routing", RoutingSettings), ("build", BuildSettings)):
        setattr(config, section, _checked(settings_type, raw.pop(section, {}), f"{path} [{section}]"))
    config.encoder = _checked(_Encoder, raw.pop("encoder", {}), f"{path} [encoder]").get("model", config.encoder)
    config.access = _access(raw.pop("access", {}), base, path)
    for name, table in raw.pop("sources", {}).items():
        try:
            check_source_name(name)
        except ValueError as error:
            raise ConfigError(f"{path} [sources]: {error}") from error
        config.sources[name] = _source_settings(name, dict(table), base, path)
    if raw:
        raise ConfigError(f"{path}: unknown keys or sections {sorted(raw)}")
    return config


@with_config(FILE_SETTINGS)
class _Defaults(TypedDict, total=False):
    method: Text
    k: Annotated[int, Field(ge=1, le=10_000, strict=True)]
    depth: Depth
    timeout_s: Seconds
    retrieval: Literal["bm25", "dense", "hybrid"]


@with_config(FILE_SETTINGS)
class _Generator(TypedDict, total=False):
    model: Text
    max_new_tokens: Count
    context_k: Count
    context_tokens: Count
    api_key_env: Text
    cite_first: Flag
    context: Literal["windows", "passages", "evidence"]
    window_tokens: Count
    evidence_tokens: Count
    answer: Literal["auto", "generate", "extractive"]
    unsupported: Literal["mark", "not_found"]


@with_config(FILE_SETTINGS)
class _Encoder(TypedDict, total=False):
    model: Text


@with_config(FILE_SETTINGS)
class _SourceOptions(TypedDict, total=False):
    weight: Weight
    timeout_s: Seconds
    retrieval: Literal["bm25", "dense", "hybrid"]
    enabled: Flag


def _checked(kind, values, where: str):
    """`values` validated as `kind` (a settings dataclass, a section's keys, a value type), or a ConfigError
    that names each key at fault and what it must be."""
    try:
        return TypeAdapter(kind).validate_python(values)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(part) for part in e['loc']) or 'value'}: "
                             f"{e['msg'].removeprefix('Value error, ')}" for e in error.errors())
        raise ConfigError(f"{where}: {problems}") from None


def _access(table: object, base: Path, path: Path) -> AccessSettings:
    """`[access]`, its key file relative to the config file."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path} [access]: must be a table")
    table = dict(table)
    try:
        principals = parse_principals(table.pop("principals", {}), f"{path} [access.principals]")
    except AccessError as error:
        raise ConfigError(str(error)) from None
    access = _checked(AccessSettings, table, f"{path} [access]")
    keys_file = str(base / access.keys_file) if access.keys_file else ""
    return AccessSettings(keys_file=keys_file, principals=principals)


def engine_settings(table: dict[str, Any], base: Path, where: str):
    """The settings of a source an engine serves (`kind` one of ENGINE_KINDS), with a folder, file or model named
    by a relative path taken relative to the file that names it (`base`)."""
    kind = table.pop("kind", None)
    if kind not in ENGINE_KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(ENGINE_KINDS)}")
    settings_type, _ = engine_types(kind)
    return _checked(settings_type, relative_to(table, base), where)


def _source_settings(name: str, table: dict[str, Any], base: Path, path: Path) -> SourceSettings:
    options = _checked(_SourceOptions, {k: table.pop(k) for k in _SOURCE_SETTINGS if k in table},
                       f"{path} [sources.{name}]")
    settings = SourceSettings(weight=float(options.get("weight", 1.0)), timeout_s=options.get("timeout_s"),
                              retrieval=options.get("retrieval"), enabled=options.get("enabled", True))
    if table.get("kind") == "postgres":
        table.pop("kind")
        table.setdefault("table", default_table(name))
        try:
            settings.postgres = PostgresSettings(**table)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{path} [sources.{name}]: {error}") from error
    elif table.get("kind") in ENGINE_KINDS:
        settings.engine = engine_settings(table, base, f"{path} [sources.{name}]")
    elif "kind" in table or "path" in table:
        missing = _SOURCE_BUILD - set(table)
        if missing:
            raise ConfigError(f"{path} [sources.{name}]: missing {sorted(missing)}")
        kind, source_path = table.pop("kind"), table.pop("path")
        for key in ("corpus", "queries"):  # paths inside options are relative to the config file too
            if key in table:
                table[key] = str(base / table[key])
        try:
            settings.spec = SourceSpec(name=name, kind=kind, path=str(base / source_path), options=table)
        except ValueError as error:
            raise ConfigError(f"{path}: {error}") from error
    elif table:
        raise ConfigError(f"{path} [sources.{name}]: unknown keys {sorted(table)} "
                          f"(settings: {', '.join(sorted(_SOURCE_SETTINGS))}; to build: kind, path, options)")
    return settings
