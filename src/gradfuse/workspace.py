"""The library API that the CLI, the server, MCP, the OpenAI endpoint and the framework components are thin shells
over: a short facade over the source catalog (federation/catalog.py), the query pipeline (query.py) and the answer
path (reading/answering.py). What a shell needs that is not here gets a module of its own, not a method here.

Its methods hand over to those parts and do not call each other: a subclass that overrides one changes that call
only. To change how a step works for every path, wrap or replace the part that owns it (`catalog`, `query`,
`answers`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from gradfuse.access import EVERYTHING, Principal
from gradfuse.reading.answering import Answer, Answerer
from gradfuse.candidate import Candidate
from gradfuse.config import Config, load_config
from gradfuse.reading.evidence import Evidence
from gradfuse.execute import LOCAL, Executor
from gradfuse.query import QueryPipeline, SearchResult
from gradfuse.reading.scoring import EvidenceSettings
from gradfuse.selection import SelectionSettings
from gradfuse.indexing import BuildReport
from gradfuse.sources import Source, SourceSpec, SourceStats
from gradfuse.federation.catalog import SourceCatalog
from gradfuse.federation.federated import FederatedResult

__all__ = ["Answer", "SearchResult", "Workspace"]


class Workspace:
    def __init__(self, config: Config, *, executor: Executor | None = None):
        """`executor`: where stage 2's LM passes run (gradfuse.execute; default this process)."""
        self._config = config
        self.root = config.workspace
        self.catalog = SourceCatalog(config)
        self.guards = self.catalog.guards  # each source's workers and breaker (federation/guard.py)
        self.query = QueryPipeline(config, self.catalog, executor or LOCAL)
        self.answers = Answerer(self.query)

    @classmethod
    def open(cls, config_file: Path | str | None = None, *, workspace: Path | str | None = None) -> Workspace:
        return cls(load_config(config_file, workspace=workspace))

    @property
    def config(self) -> Config:
        """The settings; one set here reaches every part (not the workspace folder, nor the guards: made once)."""
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        self._config = self.catalog.config = self.query.config = config

    @property
    def executor(self) -> Executor:
        """Where stage 2's and the evidence's LM passes run (gradfuse.execute); `gradfuse serve` sets a Ray one."""
        return self.query.executor

    @executor.setter
    def executor(self, executor: Executor) -> None:
        self.query.executor = executor

    def close(self) -> None:
        """Close every opened source, database pool and the embedding cache (from this thread: a pool left to
        the garbage collector was closed from its own worker thread, which cannot join itself)."""
        self.catalog.close()
        self.query.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- sources (federation/catalog.py)

    def index(self, spec: SourceSpec, *, into: str | None = None, table: str | None = None,
              language: str | None = None, progress: bool = False, wait: bool = False,
              options_seen: str | None = None, encoder: str | None = None) -> BuildReport:
        """Build `spec` into the workspace folder, or with `into` (a PostgreSQL URL) load it into a table there
        (default: the source's name) and register that table in the workspace as the source. `wait`: if another
        process is building the same source, wait for it instead of failing. `options_seen`: the published
        options when `spec` was read (indexing/folder_sync.py); `encoder`: another than the configured one."""
        return self.catalog.index(spec, into=into, table=table, language=language, progress=progress, wait=wait,
                                  options_seen=options_seen, encoder=encoder)

    def build_configured(self, *, progress: bool = False) -> list[BuildReport]:
        """Build every source the config declares; where any fails, the others are built all the same and
        `BuildsFailed` (a SourceError) is raised at the end with every source's report."""
        return self.catalog.build_configured(progress=progress)

    def add_source(self, name: str, retriever) -> None:
        """A LangChain or LlamaIndex `BaseRetriever` as source `name` of this workspace, for as long as it is
        open (sources/retriever.py)."""
        self.catalog.add(name, retriever)

    def source_names(self) -> list[str]:
        return self.catalog.names()

    def source(self, name: str, retrieval: str | None = None) -> Source:
        """The opened source, reopened when a build (in this or another process) has published a new version,
        so a long-running server answers from the latest index without a restart. A replaced version, or one
        beyond `[routing] max_open` open sources, is closed once no request holds it: to use it for longer than a
        call, hold it (`holding`)."""
        return self.catalog.source(name, retrieval)

    def holding(self, name: str, retrieval: str | None = None) -> AbstractContextManager[Source]:
        """The source, held open for the duration (a context manager): a publish meanwhile closes it only when the
        last holder is done (86 publishes left 124 descriptors open on deleted files, and their disk space held)."""
        return self.catalog.holding(name, retrieval)

    def held_elsewhere(self, name: str) -> bool:
        """A source held elsewhere (PostgreSQL, an engine, a retriever object): its answers change without a
        publish here, and asking it may take its timeout."""
        return self.catalog.held_elsewhere(name)

    def source_health(self, *, databases: bool = True, stats: bool = True,
                      principal: Principal = EVERYTHING) -> list[tuple[str, SourceStats | None, str | None]]:
        """(name, stats, None) for each source that opens and answers its stats, (name, None, why) for the rest,
        including folders under sources/ that are skipped for their name. Without `databases`, PostgreSQL
        sources are left out (a readiness probe must not wait for a database's connect timeout); without `stats`
        a source that opens is (name, None, None) (a probe need not measure index folders). Only the sources
        `principal` may read."""
        return self.catalog.health(databases=databases, stats=stats, principal=principal)

    # --- searching (query.py)

    def search(self, query: str, *, method: str | None = None, k: int | None = None,
               sources: list[str] | None = None, retrieval: str | None = None, timeout_s: float | None = None,
               depth: int | None = None, gold: str | None = None, principal: Principal = EVERYTHING,
               **rerank_options) -> SearchResult:
        """Rank candidates from many sources with `method` (see `gradfuse.methods`). `rerank_options` override
        fields of the configured RerankSettings (n, estimator, target, ...); `gold` is the reference answer that
        the gold target needs; `principal`: who asks (gradfuse.access; default: may read everything)."""
        return self.query.search(query, method=method, k=k, sources=sources, retrieval=retrieval,
                                 timeout_s=timeout_s, depth=depth, gold=gold, principal=principal, **rerank_options)

    def retrieve(self, query: str, *, sources: list[str] | None = None, retrieval: str | None = None,
                 timeout_s: float | None = None, depth: int | None = None,
                 principal: Principal = EVERYTHING) -> FederatedResult:
        """Every named (default: every enabled) source's own ranking of `query`, queried concurrently."""
        return self.query.retrieve(query, sources=sources, retrieval=retrieval, timeout_s=timeout_s, depth=depth,
                                   principal=principal)

    def rank(self, query: str, federated: FederatedResult, *, method: str | None = None, k: int | None = None,
             gold: str | None = None, selection: SelectionSettings | None = None, **rerank_options) -> SearchResult:
        """Apply `method` to one federated result. The candidates are modified (scores, merged duplicates): give
        each call its own `federated` (see `FederatedResult.copy`). `selection` overrides the configured stage-1
        settings (the evaluation harness passes values tuned on dev queries)."""
        return self.query.rank(query, federated, method=method, k=k, gold=gold, selection=selection,
                               **rerank_options)

    # --- answering (reading/answering.py)

    def ask(self, question: str, *, generator: str | None = None, context_k: int | None = None,
            max_new_tokens: int | None = None, **search_options) -> Answer:
        return self.answers.ask(question, generator=generator, context_k=context_k, max_new_tokens=max_new_tokens,
                                **search_options)

    def ask_stream(self, question: str, *, generator: str | None = None, context_k: int | None = None,
                   max_new_tokens: int | None = None, **search_options) -> Iterator[SearchResult | str | Answer]:
        """`ask`, step by step: first the SearchResult (the passages the generator will see), then the answer's
        text in pieces as they are decoded, last the Answer with its citations."""
        return self.answers.ask_stream(question, generator=generator, context_k=context_k,
                                       max_new_tokens=max_new_tokens, **search_options)

    @property
    def answers_extractively(self) -> bool:
        """Whether an answer with no generator named is the evidence's own sentences (`[generator] answer`)."""
        return self.answers.extractive

    def evidence(self, question: str, passages: list[Candidate], *, settings: EvidenceSettings | None = None,
                 gold: str | None = None, chars: int | None = None) -> list[Evidence]:
        """Every sentence of `passages` (numbered from 1; of their first `chars` characters, as far as a generator's
        prompt shows them, or all of them) with the `[evidence]` scorer's value, best first; none with scorer
        "none"."""
        return self.answers.evidence(question, passages, settings=settings, gold=gold, chars=chars)

    def support(self, question: str, evidence: list[Evidence], decide_at: float | None = None) -> float | None:
        """The chance that `evidence` (every sentence of an answer's passages) holds the answer to `question`
        (reading/support.py); None without sentences scored. `decide_at`: a threshold the chance is compared with,
        where a lower bound that clears it will do (`support.chance`: fewer sentences encoded)."""
        return self.answers.support(question, evidence, decide_at)
