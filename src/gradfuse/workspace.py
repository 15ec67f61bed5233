"""The library API that the CLI (and later the server) are thin shells over."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gradfuse.candidate import Candidate
from gradfuse.checked import MAX_DEPTH
from gradfuse.config import Config, load_config
from gradfuse.evidence import Evidence, excerpts, extractive_answer, not_found, passage_sentences
from gradfuse.generate import BUNDLED_GENERATOR, Citation, fit_to_window, make_generator, parse_citations
from gradfuse.generate.local import load_tokenizer
from gradfuse.generate.prompt import EXTRACTIVE, PASSAGE_CHARS, build_messages
from gradfuse.execute import LOCAL, Executor
from gradfuse.methods import PIPELINE_METHODS, MethodContext, check_method, run_method, spec_of
from gradfuse.rerank import RerankOutcome, support
from gradfuse.rerank.sentences import LM_SENTENCE_SCORERS, EvidenceSettings, score_texts, within_passes
from gradfuse.rerank.sentences import Passage as SentencePassage
from gradfuse.selection import SelectionDecision, SelectionSettings
from gradfuse.sources import (
    BuildReport,
    Source,
    SourceError,
    SourceSpec,
    SourceStats,
    UnknownSource,
    build_source,
    built_source_names,
    check_source_name,
    misnamed_source_folders,
    open_source,
)
from gradfuse.sources.base import current_version
from gradfuse.sources.engines import open_engine
from gradfuse.sources.retriever import RetrieverSource
from gradfuse.sources.postgres import (
    PostgresSettings,
    PostgresSource,
    PostgresTable,
    default_table,
    register,
    registered,
    safe_url,
)
from gradfuse.sources.postgres_load import load_into_postgres
from gradfuse.sources.encoder import EmbeddingCache, embedding_text, load_encoder
from gradfuse.sources.federated import FederatedResult, SourceFailure, ask_sources, checked_sources
from gradfuse.sources.guard import Guards


@dataclass(eq=False)
class _Opened:
    """One opened version of a source, and how many requests hold it."""

    version: object  # a version folder, or a table's settings
    source: Source
    users: int = 0
    retired: bool = False  # a newer version is published: close when the last user is done

    def close(self) -> None:
        if hasattr(self.source, "close"):
            self.source.close()


@dataclass
class _Prepared:
    """What an answer is made from: the passages, the generator (None: extractive) and its prompt."""

    result: SearchResult
    model: object | None
    messages: list[dict[str, str]]
    dropped: list[Candidate]
    evidence: list[Evidence]  # every sentence of the passages shown, best first
    options: dict
    support: float | None  # the chance that the passages hold the answer (`Workspace.support`)
    abstained: bool  # below `[evidence] abstain_below`: the answer says "not found" and nothing is generated
    within: float | None = None  # a second quoted sentence's value is this close to the first's (support only)

    def extract(self) -> str:
        quote = not_found if self.abstained else extractive_answer
        return quote(self.evidence, within=self.within)


@dataclass
class SearchResult:
    query: str
    method: str
    candidates: list[Candidate]  # ranked by the method, best first, cut to k
    ranked_lists: dict[str, list[Candidate]]  # what each answering source returned
    failures: list[SourceFailure]
    timings: dict[str, float] = field(default_factory=dict)  # seconds: retrieval, ranking, source:<name>
    selection: SelectionDecision | None = None  # stage 1's decision (select, gro)
    rerank: RerankOutcome | None = None  # stage 2's pass (gradient, gro, the LM baselines, the oracles)


@dataclass
class Answer:
    question: str
    text: str
    citations: list[Citation]
    invalid_citations: list[int]  # numbers the model cited that match no passage
    generator: str
    search: SearchResult  # how the passages were chosen (selection decision, rerank scores)
    timings: dict[str, float] = field(default_factory=dict)
    dropped: list[Candidate] = field(default_factory=list)  # the lowest-ranked, left out to fit the window
    evidence: list[Evidence] = field(default_factory=list)  # the passages' sentences it quotes, best first
    support: float | None = None  # the chance that the passages hold the answer (`Workspace.support`)
    abstained: bool = False  # the evidence was too weak: "not found in these sources", with what came closest

    @property
    def passages(self) -> list[Candidate]:
        """What the generator saw, numbered from 1."""
        return self.search.candidates[:len(self.search.candidates) - len(self.dropped)]

    @property
    def failures(self) -> list[SourceFailure]:
        return self.search.failures


class Workspace:
    def __init__(self, config: Config, *, executor: Executor | None = None):
        """`executor`: where stage 2's LM passes run (gradfuse.execute; default this process)."""
        self.config = config
        self.executor = executor or LOCAL
        self.root = config.workspace
        # (name, mode) → the opened source, at a version folder or a table's settings
        self._sources: dict[tuple[str, str], _Opened] = {}
        self._tables: dict[str, PostgresTable] = {}  # one connection pool per database table
        self._added: dict[str, Source] = {}  # sources given as objects (add_source)
        self._lock = threading.Lock()
        self._embeddings: EmbeddingCache | None = None
        self.guards = Guards(config.guard)  # each source's workers and breaker (sources/guard.py)

    @classmethod
    def open(cls, config_file: Path | None = None, *, workspace: Path | None = None) -> Workspace:
        return cls(load_config(config_file, workspace=workspace))

    def close(self) -> None:
        """Close every opened source, database pool and the embedding cache (from this thread: a pool left to
        the garbage collector was closed from its own worker thread, which cannot join itself)."""
        with self._lock:
            opened, self._sources = list(self._sources.values()), {}
            tables, self._tables = list(self._tables.values()), {}
            embeddings, self._embeddings = self._embeddings, None
        self.guards.close()
        for source in opened:
            source.close()
        for table in tables:
            table.close()
        if embeddings is not None:
            embeddings.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- building

    def index(self, spec: SourceSpec, *, into: str | None = None, table: str | None = None,
              language: str | None = None, progress: bool = False, wait: bool = False) -> BuildReport:
        """Build `spec` into the workspace folder, or with `into` (a PostgreSQL URL) load it into a table there
        (default: the source's name) and register that table in the workspace as the source. `wait`: if another
        process is building the same source, wait for it instead of failing."""
        if into is None:
            return build_source(self.root, spec, encoder=self.config.encoder, progress=progress, wait=wait)
        if spec.kind == "run":
            raise ValueError("a TREC run source answers only its own queries and cannot be loaded into a database")
        settings = PostgresSettings(table=table or default_table(spec.name), url=safe_url(into),
                                    **({"language": language} if language else {}))
        report = load_into_postgres(self.root, spec, settings, into, encoder=self.config.encoder, progress=progress)
        register(self.root / "sources" / spec.name, settings)
        return report

    def build_configured(self, *, progress: bool = False) -> list[BuildReport]:
        specs = [s.spec for s in self.config.sources.values() if s.spec is not None]
        if not specs:
            raise SourceError("the config file declares no source to build ([sources.NAME] with kind and path)")
        return [self.index(spec, progress=progress) for spec in specs]

    def add_source(self, name: str, retriever) -> None:
        """A LangChain or LlamaIndex `BaseRetriever` as source `name` of this workspace, for as long as it is
        open (sources/retriever.py)."""
        if name in set(built_source_names(self.root)) | set(self.config.sources):
            raise SourceError(f"a source named {name!r} exists already in this workspace")
        self._added[check_source_name(name)] = RetrieverSource(name, retriever)

    # --- reading

    def source_names(self) -> list[str]:
        configured = [n for n, s in self.config.sources.items() if s.postgres is not None or s.engine is not None]
        names = sorted(set(built_source_names(self.root)) | set(configured) | set(self._added))
        return [n for n in names if self.config.settings(n).enabled]

    def source(self, name: str, retrieval: str | None = None) -> Source:
        """The opened source, reopened when a build (in this or another process) has published a new version,
        so a long-running server answers from the latest index without a restart. A replaced version is closed
        once no request holds it (see `holding`)."""
        return self._current(name, retrieval).source

    @contextmanager
    def holding(self, name: str, retrieval: str | None = None) -> Iterator[Source]:
        """The source, held open for the duration: a publish meanwhile closes it only when the last holder is
        done (86 publishes left 124 descriptors open on deleted files, and their disk space held)."""
        opened = self._current(name, retrieval, hold=True)
        try:
            yield opened.source
        finally:
            with self._lock:
                opened.users -= 1
                done = opened.retired and opened.users == 0
            if done:
                opened.close()

    def _current(self, name: str, retrieval: str | None, *, hold: bool = False) -> _Opened:
        check_source_name(name)  # a name is a folder here: no other path may be reached through it
        if name in self._added:  # an object the caller keeps: never replaced by a publish, never closed here
            return _Opened(self._added[name], self._added[name], users=int(hold))
        mode = retrieval or self.config.settings(name).retrieval or self.config.retrieval
        postgres = self.config.settings(name).postgres or registered(self.root / "sources" / name)
        engine = self.config.settings(name).engine
        version = postgres or engine or current_version(self.root / "sources" / name)
        with self._lock:
            opened = self._sources.get((name, mode))
            if opened is not None and opened.version == version:
                opened.users += hold
                return opened
        # Opened outside the lock: connecting to a database may take its timeout, and must not hold up the other
        # sources of the same request.
        if postgres:
            source = self._open_postgres(name, postgres, mode)
        elif engine:
            source = open_engine(name, engine, self.config.settings(name).timeout_s or self.config.timeout_s, mode)
        else:
            source = open_source(self.root, name, mode=mode, version=version if version else None)
        opened = _Opened(version, source, users=int(hold))
        retired = []
        with self._lock:
            # Let go of every older version of this source (all modes): its files were deleted when the new one
            # was published; each is closed now, or when the requests still using it finish.
            for key in [k for k, o in self._sources.items() if k[0] == name and o.version != version]:
                old = self._sources.pop(key)
                old.retired = True
                if old.users == 0:
                    retired.append(old)
            if (name, mode) in self._sources and self._sources[(name, mode)].version == version:
                retired.append(opened)  # another thread opened the same version meanwhile: keep theirs
                opened = self._sources[(name, mode)]
                opened.users += hold
            else:
                self._sources[(name, mode)] = opened
        for old in retired:
            old.close()
        return opened

    def held_elsewhere(self, name: str) -> bool:
        """A source held elsewhere (PostgreSQL, an engine, a retriever object): its answers change without a
        publish here, and asking it may take its timeout."""
        settings = self.config.settings(name)
        return name in self._added or \
            (settings.postgres or settings.engine or registered(self.root / "sources" / name)) is not None

    def _open_postgres(self, name: str, settings: PostgresSettings, mode: str) -> Source:
        with self._lock:
            table = self._tables.get(name)
        if table is None or table.settings != settings:
            timeout = self.config.settings(name).timeout_s or self.config.timeout_s
            replaced, table = table, PostgresTable(name, settings, timeout_s=timeout)
            with self._lock:
                self._tables[name] = table
            if replaced is not None:
                replaced.close()
        return PostgresSource(table, mode=mode, encoder=self.config.encoder)

    def source_health(self, *, databases: bool = True,
                      stats: bool = True) -> list[tuple[str, SourceStats | None, str | None]]:
        """(name, stats, None) for each source that opens and answers its stats, (name, None, why) for the rest,
        including folders under sources/ that are skipped for their name. Without `databases`, PostgreSQL
        sources are left out (a readiness probe must not wait for a database's connect timeout); without `stats`
        a source that opens is (name, None, None) (a probe need not measure index folders)."""
        health = [(name, None, "skipped: not a valid source name (1 to 64 ASCII letters, digits, '-' or '_'); "
                               "rename the folder to use it")
                  for name in misnamed_source_folders(self.root)]
        names = [n for n in self.source_names() if databases or not self.held_elsewhere(n)]
        return health + checked_sources(names, lambda name: self._stats_of(name, stats), self._timeouts(names),
                                        self.guards)

    def _stats_of(self, name: str, stats: bool) -> SourceStats | None:
        with self.holding(name) as source:
            return source.stats() if stats else None

    def search(
        self,
        query: str,
        *,
        method: str | None = None,
        k: int | None = None,
        sources: list[str] | None = None,
        retrieval: str | None = None,
        timeout_s: float | None = None,
        depth: int | None = None,
        gold: str | None = None,
        **rerank_options,
    ) -> SearchResult:
        """Rank candidates from many sources with `method` (see `gradfuse.methods`). `rerank_options` override
        fields of the configured RerankSettings (n, estimator, target, ...); `gold` is the reference answer that
        the gold target needs."""
        method = method or self.config.method
        names = self._resolve_sources(sources)
        check_method(method, names)
        if method.startswith("single:"):
            names = [method.removeprefix("single:")]
        k = k or self.config.k
        federated = self.retrieve(query, sources=names, retrieval=retrieval, timeout_s=timeout_s,
                                  depth=max(k, depth or self.config.depth))
        return self.rank(query, federated, method=method, k=k, gold=gold, **rerank_options)

    def retrieve(
        self,
        query: str,
        *,
        sources: list[str] | None = None,
        retrieval: str | None = None,
        timeout_s: float | None = None,
        depth: int | None = None,
    ) -> FederatedResult:
        """Every named (default: every enabled) source's own ranking of `query`, queried concurrently."""
        if not query.strip():
            raise ValueError("the query is empty")
        if depth is not None and not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be 1 to {MAX_DEPTH} (candidates asked of each source)")
        names = self._resolve_sources(sources)
        return ask_sources(names, lambda name: self._lease(name, retrieval), query, depth or self.config.depth,
                           self._timeouts(names, timeout_s), self.guards)

    def _timeouts(self, names: list[str], timeout_s: float | None = None) -> dict[str, float]:
        return {n: timeout_s or self.config.settings(n).timeout_s or self.config.timeout_s for n in names}

    def _lease(self, name: str, retrieval: str | None) -> tuple[Source, Callable[[], None]]:
        """The source held open (see `holding`), and what lets go of it: opened on the source's own worker."""
        held = self.holding(name, retrieval)
        return held.__enter__(), lambda: held.__exit__(None, None, None)

    def rank(
        self,
        query: str,
        federated: FederatedResult,
        *,
        method: str | None = None,
        k: int | None = None,
        gold: str | None = None,
        selection: SelectionSettings | None = None,
        **rerank_options,
    ) -> SearchResult:
        """Apply `method` to one federated result. The candidates are modified (scores, merged duplicates): give
        each call its own `federated` (see `FederatedResult.copy`). `selection` overrides the configured stage-1
        settings (the evaluation harness passes values tuned on dev queries)."""
        method = method or self.config.method
        check_method(method, list(federated.ranked_lists) + [f.source for f in federated.failures])
        k = k or self.config.k
        started = time.perf_counter()
        context = None
        if method in PIPELINE_METHODS:  # only they need the encoder's and the scoring LM's view
            rerank = replace(self.config.rerank, **rerank_options)
            if spec_of(method, rerank.scorer).target and rerank.target == "gold" and not gold:
                raise ValueError(f"method {method!r} with target 'gold' needs a reference answer (gold)")
            context = MethodContext(
                question=query, query_vector=self._encoder().encode_query(query), embed=self._embed,
                selection=selection or self.config.selection, rerank=rerank, gold=gold, k=k,
                executor=self.executor,
            )
        weights = {n: self.config.settings(n).weight for n in federated.ranked_lists}
        ranked = run_method(method, federated.ranked_lists, weights=weights, context=context)
        timings = {"retrieval": federated.wall_seconds, "ranking": time.perf_counter() - started, **ranked.seconds}
        timings.update({f"source:{n}": s for n, s in federated.seconds.items()})
        return SearchResult(query, method, ranked.candidates[:k], federated.ranked_lists, federated.failures,
                            timings, ranked.selection, ranked.rerank)

    def _encoder(self):
        return load_encoder(self.config.encoder)

    def _embed(self, candidates: list[Candidate]) -> np.ndarray:
        """Candidate vectors from the workspace cache: indexed passages hit it on disk; an engine's or a remote's
        are encoded and held in memory, bounded (sources/encoder.py)."""
        with self._lock:
            if self._embeddings is None:
                self._embeddings = EmbeddingCache(self.root / "cache" / "embeddings.sqlite", self._encoder())
        return self._embeddings.embed([embedding_text(c.title, c.text) for c in candidates], keep=False)

    def _resolve_sources(self, requested: list[str] | None) -> list[str]:
        available = self.source_names()
        if not available:
            raise SourceError(f"no sources are built in {self.root}: run `gradfuse index ...` first")
        if not requested:
            return available
        unknown = [n for n in requested if n not in available]
        if unknown:
            listing = f"(available: {', '.join(available)})"
            raise UnknownSource(f"unknown source(s) {', '.join(unknown)} {listing}", f"sources: unknown source {listing}")
        return list(dict.fromkeys(requested))

    def ask(
        self,
        question: str,
        *,
        generator: str | None = None,
        context_k: int | None = None,
        max_new_tokens: int | None = None,
        **search_options,
    ) -> Answer:
        prepared = self._prepare_answer(question, generator, context_k, max_new_tokens, search_options)
        started = time.perf_counter()
        text = prepared.extract() if prepared.model is None else prepared.model.generate(prepared.messages,
                                                                                          **prepared.options)
        return self._answer(question, text, prepared, time.perf_counter() - started)

    def ask_stream(
        self,
        question: str,
        *,
        generator: str | None = None,
        context_k: int | None = None,
        max_new_tokens: int | None = None,
        **search_options,
    ) -> Iterator[SearchResult | str | Answer]:
        """`ask`, step by step: first the SearchResult (the passages the generator will see), then the answer's
        text in pieces as they are decoded, last the Answer with its citations."""
        prepared = self._prepare_answer(question, generator, context_k, max_new_tokens, search_options)
        yield prepared.result
        started = time.perf_counter()
        if prepared.model is None:
            yield (text := prepared.extract())
            yield self._answer(question, text, prepared, time.perf_counter() - started)
            return
        pieces = []
        with closing(prepared.model.stream(prepared.messages, **prepared.options)) as stream:  # closed at once
            for piece in stream:                                                               # when our reader stops
                if piece:
                    pieces.append(piece)
                    yield piece
        yield self._answer(question, "".join(pieces).strip(), prepared, time.perf_counter() - started)

    @property
    def answers_extractively(self) -> bool:
        """Whether an answer with no generator named is the evidence's own sentences (`[generator] answer`)."""
        answer = self.config.answer
        return answer == "extractive" or (answer == "auto" and self.config.generator == BUNDLED_GENERATOR)

    def evidence(self, question: str, passages: list[Candidate], *, settings: EvidenceSettings | None = None,
                 gold: str | None = None, chars: int | None = None) -> list[Evidence]:
        """Every sentence of `passages` (numbered from 1; of their first `chars` characters, as far as a generator's
        prompt shows them, or all of them) with the `[evidence]` scorer's value, best first; none with scorer
        "none"."""
        settings = settings or self.config.evidence
        if settings.scorer == "none" or not passages:
            return []
        shown = [c.text[:chars] for c in passages]
        units = [SentencePassage(f"{c.title}: " if c.title else "", text, passage_sentences(c, text))
                 for c, text in zip(passages, shown)]
        if settings.target == "gold" and not gold:
            raise ValueError("[evidence] target 'gold' needs a reference answer (gold)")
        target = gold if settings.target == "gold" else None
        if settings.scorer in LM_SENTENCE_SCORERS:  # on the executor, as stage 2's passes
            units = within_passes(settings.scorer, units, settings.max_lm_passes)
            fit, values = self.executor.sentences(settings.scorer, question, units, self.config.rerank,
                                                  target=target, calibrated=settings.calibrated)
            units, passages = units[:fit], passages[:fit]
        scored = [Evidence.of(number, candidate, span, 0.0)
                  for number, (candidate, unit) in enumerate(zip(passages, units), start=1) for span in unit.sentences]
        if settings.scorer not in LM_SENTENCE_SCORERS:  # read as quoted: a table row with its column names
            encoder = self._encoder()
            values = score_texts(settings.scorer, question, [e.quoted() for e in scored], embed=encoder.encode_short,
                                 query_vector=encoder.encode_query(question), passages=[e.passage for e in scored])
        return sorted((replace(e, score=float(value)) for e, value in zip(scored, values, strict=True)),
                      key=lambda e: -e.score)

    def support(self, question: str, evidence: list[Evidence]) -> float | None:
        """The chance that `evidence` (every sentence of an answer's passages) holds the answer to `question`
        (rerank/support.py); None without sentences scored."""
        if not evidence:
            return None
        return support.answered(support.quoted_signals(question, evidence, self._encoder()), support.model())

    def _prepare_answer(self, question, generator, context_k, max_new_tokens, search_options) -> _Prepared:
        result = self.search(question, k=context_k or self.config.context_k, **search_options)
        extractive = generator is None and self.answers_extractively
        model = None if extractive else make_generator(generator or self.config.generator,
                                                       context_tokens=self.config.context_tokens,
                                                       api_key_env=self.config.api_key_env)
        max_new_tokens = max_new_tokens or self.config.max_new_tokens
        if model is None:
            messages, dropped = [], []
        else:
            messages, dropped = fit_to_window(question, result.candidates, model, max_new_tokens)
        shown = result.candidates[: len(result.candidates) - len(dropped)]
        started = time.perf_counter()
        # A generator reads the start of each passage (PASSAGE_CHARS); a quoted answer can quote all of it.
        evidence = self.evidence(question, shown, gold=search_options.get("gold"),
                                 chars=None if model is None else PASSAGE_CHARS)
        chance = self.support(question, evidence)
        result.timings["evidence"] = time.perf_counter() - started
        abstained = support.declines(question, evidence, chance, self.config.evidence.abstain_below)
        if abstained:  # nothing to answer from: no generator writes one
            model = None
        if model is not None and self.config.context == "evidence" and evidence:
            tokenizer = load_tokenizer(self.config.rerank.model)
            kept = excerpts(evidence, lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
                            self.config.evidence_tokens)
            messages = build_messages(question, shown, excerpts=kept)
        options = {"max_new_tokens": max_new_tokens, "passages": len(shown) if self.config.cite_first else 0}
        within = support.model().second_within if self.config.evidence.scorer == "support" else None
        return _Prepared(result, model, messages, dropped, evidence, options, chance, abstained, within)

    def _answer(self, question: str, text: str, prepared: _Prepared, seconds: float) -> Answer:
        result = prepared.result
        answer = Answer(question, text, [], [], prepared.model.name if prepared.model else EXTRACTIVE, result,
                        {**result.timings, "generation": seconds}, prepared.dropped,
                        prepared.evidence[: self.config.evidence.top], prepared.support, prepared.abstained)
        answer.citations, answer.invalid_citations = parse_citations(text, answer.passages)
        return answer
