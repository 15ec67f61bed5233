"""A workspace's sources: which exist (built indexes, PostgreSQL tables, engines and remotes from the config,
retrievers a caller added), building them, each one opened (reopened when a build publishes a new version, the old
one closed once no request holds it; at most `[routing] max_open` held open, the least recently used closed
beyond), their summaries (what routing reads), their health, and their guards (each source's workers and breaker).
What decides which sources a question may reach, routing and permissions, plugs in here.

It may import sources/ and config.py, never the query pipeline or the answer path."""

from __future__ import annotations

import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gradfuse.access import EVERYTHING, Principal
from gradfuse.config import Config
from gradfuse.indexing import BuildReport, build_source
from gradfuse.indexing.folder_sync import options_published
from gradfuse.indexing.report import BuildsFailed
from gradfuse.ingest.documents import IngestError
from gradfuse.ray_cluster import RayUnavailable
from gradfuse.sources import (
    Source,
    SourceError,
    SourceSpec,
    SourceStats,
    UnknownSource,
    built_source_names,
    check_source_name,
    misnamed_source_folders,
    open_source,
)
from gradfuse.sources.base import current_version, listing_stamp
from gradfuse.sources.engines import open_engine
from gradfuse.federation.federated import checked_sources
from gradfuse.federation.guard import Guards
from gradfuse.sources.postgres import (
    PostgresSettings,
    PostgresSource,
    PostgresTable,
    default_table,
    register,
    registered,
    safe_url,
)
from gradfuse.indexing.postgres_load import load_into_postgres
from gradfuse.sources.retriever import RetrieverSource
from gradfuse.federation.summaries import Summaries


STAMP_SETTLED_NS = 2_000_000_000
AUTO_MAX_OPEN = 1024


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


class SourceCatalog:
    def __init__(self, config: Config):
        self.config = config
        self.root = config.workspace
        # (name, mode) → the opened source, at a version folder or a table's settings; least recently used first
        self._sources: OrderedDict[tuple[str, str], _Opened] = OrderedDict()
        self._tables: dict[str, PostgresTable] = {}  # one connection pool per database table
        self._added: dict[str, Source] = {}  # sources given as objects (add)
        self._listing: tuple[int | None, list[str]] | None = None  # the sources folder's stamp, the names built
        self.listings = 0  # how many times the built sources were listed (what was read from them may be stale)
        self._registrations: dict[str, PostgresSettings | None] = {}  # read since the last listing
        self._names: tuple[tuple, list[str]] | None = None
        self._lock = threading.Lock()
        self.guards = Guards(config.guard)  # each source's workers and breaker (federation/guard.py)
        self.summaries = Summaries(self)  # what routing reads (federation/summaries.py)

    def close(self) -> None:
        """Close every opened source and database pool (from this thread: a pool left to the garbage collector was
        closed from its own worker thread, which cannot join itself)."""
        with self._lock:
            opened, self._sources = list(self._sources.values()), OrderedDict()
            tables, self._tables = list(self._tables.values()), {}
        self.summaries.close()
        self.guards.close()
        for source in opened:
            source.close()
        for table in tables:
            table.close()

    # --- building

    def index(self, spec: SourceSpec, *, into: str | None = None, table: str | None = None,
              language: str | None = None, progress: bool = False, wait: bool = False,
              options_seen: str | None = None, encoder: str | None = None) -> BuildReport:
        if into is None:
            return build_source(self.root, spec, encoder=encoder or self.config.encoder, progress=progress,
                                wait=wait, ray_address=self.config.build.ray_address, options_seen=options_seen)
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
        # What was published as the config was read: a build of these sources, one after another, publishes none
        # over a version another build published meanwhile with other options (indexing/folder_sync.py)
        seen = {spec.name: options_published(self.root / "sources" / spec.name) for spec in specs}
        reports = [self._build_or_fail(spec, progress, seen[spec.name]) for spec in specs]
        if any(report.status == "failed" for report in reports):
            raise BuildsFailed(reports)
        return reports

    def _build_or_fail(self, spec: SourceSpec, progress: bool, seen: str) -> BuildReport:
        """One declared source's build; its failure is its report's, so that the sources after it are built (a
        ValueError too: a record's duplicate id, an option's value)."""
        started = time.perf_counter()
        try:
            return self.index(spec, progress=progress, options_seen=seen)
        except (SourceError, IngestError, RayUnavailable, OSError, ValueError) as error:
            return BuildReport(spec.name, "failed", 0, time.perf_counter() - started, error=str(error))

    def add(self, name: str, retriever) -> None:
        if name in set(built_source_names(self.root)) | set(self.config.sources):
            raise SourceError(f"a source named {name!r} exists already in this workspace")
        self._added[check_source_name(name)] = RetrieverSource(name, retriever)

    # --- which sources

    def names(self) -> list[str]:
        built = self._built_names()
        key = (self.listings, id(self.config), tuple(self._added))
        known = self._names
        if known is None or known[0] != key:  # the same until a listing, the settings or an added source change
            configured = [n for n, s in self.config.sources.items() if s.postgres is not None or s.engine is not None]
            names = sorted(set(built) | set(configured) | set(self._added))
            known = self._names = (key, [n for n in names if self.config.settings(n).enabled])
        return list(known[1])

    def _built_names(self) -> list[str]:
        """The sources built or loaded here, listed again only when a publish (here or in another process) has
        moved the sources folder's stamp, or the stamp is too recent to tell one publish from the next (a file
        system may keep whole seconds): at 1,000 sources a listing reads 1,000 pointers."""
        stamp = listing_stamp(self.root / "sources")
        listing = self._listing
        if listing is None or stamp is None or listing[0] != stamp or time.time_ns() - stamp < STAMP_SETTLED_NS:
            self._registrations = {}
            listing = self._listing = (stamp, built_source_names(self.root))
            self.listings += 1
        return listing[1]

    def resolve(self, requested: list[str] | None, principal: Principal = EVERYTHING) -> list[str]:
        """The sources a request names (checked, each once), or every enabled one; only those `principal` may
        read, and a source it may not read is refused in the very words of one that does not exist."""
        available = self.names()
        if principal.sources is not None:
            available = [n for n in available if principal.may_read_source(n)]
            if not available:
                raise UnknownSource("this key may read no source of this workspace",
                                    "sources: this key may read no source of this workspace")
        if not available:
            raise SourceError(f"no sources are built in {self.root}: run `gradfuse index ...` first")
        if not requested:
            return available
        unknown = [n for n in requested if n not in available]
        if unknown:
            listing = f"(available: {', '.join(available)})"
            raise UnknownSource(f"unknown source(s) {', '.join(unknown)} {listing}", f"sources: unknown source {listing}")
        return list(dict.fromkeys(requested))

    def held_elsewhere(self, name: str) -> bool:
        return self.summary_fingerprint(name) is not None

    def _registered(self, name: str) -> PostgresSettings | None:
        """A table loaded here with `--into`, read once a listing (a registration moves the listing's stamp)."""
        registrations = self._registrations
        if name not in registrations:
            registrations[name] = registered(self.root / "sources" / name)
        return registrations[name]

    def publish_key(self, names: list[str]) -> tuple | None:
        """What a result over `names` depends on here: the sources folder's stamp, which every publish moves (the
        versions themselves while it is too recent to tell publishes apart); None where a source's data changes
        without a publish here (an engine, a table, a remote, an added retriever)."""
        self._built_names()
        if any(self.held_elsewhere(n) for n in names):
            return None
        stamp = self._listing[0]  # as the listing just read it
        if stamp is not None and time.time_ns() - stamp >= STAMP_SETTLED_NS:
            return ("published", stamp)
        return tuple((n, getattr(current_version(self.root / "sources" / n), "name", None)) for n in names)

    def timeouts(self, names: list[str], timeout_s: float | None = None) -> dict[str, float]:
        return {n: timeout_s or self.config.settings(n).timeout_s or self.config.timeout_s for n in names}

    # --- opening

    def source(self, name: str, retrieval: str | None = None) -> Source:
        return self._current(name, retrieval).source

    @contextmanager
    def holding(self, name: str, retrieval: str | None = None) -> Iterator[Source]:
        opened = self._current(name, retrieval, hold=True)
        try:
            yield opened.source
        finally:
            with self._lock:
                opened.users -= 1
                done = opened.retired and opened.users == 0
            if done:
                opened.close()

    def lease(self, name: str, retrieval: str | None) -> tuple[Source, Callable[[], None]]:
        """The source held open (see `holding`), and what lets go of it: opened on the source's own worker."""
        held = self.holding(name, retrieval)
        return held.__enter__(), lambda: held.__exit__(None, None, None)

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
                self._sources.move_to_end((name, mode))
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
            evicted = self._over_limit(keep=(name, mode))
        for old in retired:
            old.close()
        self._close(evicted)
        return opened

    def trim(self) -> None:
        """Close now the least recently used sources beyond `[routing] max_open` that no request holds (each
        opening does it; this is for a limit just lowered)."""
        with self._lock:
            evicted = self._over_limit(keep=None)
        self._close(evicted)

    def _close(self, evicted: list) -> None:
        for key, opened in evicted:
            opened.close()
            self.guards.release(key[0])
            with self._lock:  # a table's pool goes with its last open source (its connections count too)
                table = None if any(k[0] == key[0] for k in self._sources) else self._tables.pop(key[0], None)
            if table is not None:
                table.close()

    @property
    def max_open(self) -> int:
        """`[routing] max_open`; "auto": a quarter of the process's open-file limit (an open source holds about
        two files: its index's and its documents'), at most AUTO_MAX_OPEN."""
        setting = self.config.routing.max_open
        if setting != "auto":
            return setting
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return AUTO_MAX_OPEN if soft == resource.RLIM_INFINITY else max(16, min(AUTO_MAX_OPEN, soft // 4))

    def _over_limit(self, keep: tuple[str, str] | None) -> list:
        """Take out the least recently used sources that no request holds, beyond `[routing] max_open`, never
        `keep` (the one just asked for); called with the lock held, the caller closes them."""
        evicted, limit = [], self.max_open
        for key in list(self._sources):
            if len(self._sources) <= limit:
                break
            if key != keep and self._sources[key].users == 0:
                evicted.append((key, self._sources.pop(key)))
        return evicted

    def summary_fingerprint(self, name: str) -> str | None:
        """What a sampled summary depends on beyond the data (see Summaries); None for a source built here (the
        only kind not held elsewhere)."""
        settings = self.config.settings(name)
        if name in self._added:
            return f"added {name}"
        held = settings.postgres or settings.engine or self._registered(name)
        return None if held is None else repr(held)

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

    # --- health

    def health(self, *, databases: bool = True, stats: bool = True,
               principal: Principal = EVERYTHING) -> list[tuple[str, SourceStats | None, str | None]]:
        health = [(name, None, "skipped: not a valid source name (1 to 64 ASCII letters, digits, '-' or '_'); "
                               "rename the folder to use it")
                  for name in misnamed_source_folders(self.root) if principal.sources is None]
        names = [n for n in self.names() if (databases or not self.held_elsewhere(n)) and principal.may_read_source(n)]
        return health + checked_sources(names, lambda name: self._stats_of(name, stats), self.timeouts(names),
                                        self.guards)

    def _stats_of(self, name: str, stats: bool) -> SourceStats | None:
        with self.holding(name) as source:
            return source.stats() if stats else None
