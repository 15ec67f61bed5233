"""A benchmark file (TOML): the sources, the query sets and their split, the methods and the metrics.

Example (see benchmarks/*.toml for the real ones)::

    name = "federated"
    data = "../../shared/data"      # relative to this file; the environment variable GRADFUSE_DATA overrides it
    workspace = "../.gradfuse/bench/shared-sources"   # indexes and embeddings, cached between runs
    sources_from = "federated.toml"  # or: take the [sources.*] tables of another benchmark file
    retrieval = "bm25"
    encoder = "all-MiniLM-L6-v2"    # or "all-MiniLM-L6-v2@float32": the same numbers on any CPU (quick variants)
    depth = 100                     # candidates asked of each source
    k = 100                         # ranked results kept per method
    metrics = ["ndcg@10", "recall@100", "mrr@10"]
    methods = ["single:*", "static-best", "oracle-origin", "rrf", "select", "gro/query"]
    seed = 0
    [split]
    sample = 100                    # test queries per set (seeded)
    dev = 30                        # dev queries per set: the next ones of the same shuffle
    # folds = 5                     # instead: k-fold cross-fitting of the sample (for sets too small to hold out)
    [lm]                            # methods that run the scoring LM, on a subsample of the test (and dev) queries
    sample = 10
    dev_sample = 5
    [sources.scifact]
    kind = "beir"
    path = "beir_scifact"           # relative to data
    [queries.scifact]
    path = "beir_scifact"
    origin = "scifact"              # the source its qrels' documents live in, or {"table/" = "tatqa-table", ...},
                                    # or ["scifact-1", "scifact-2"]: sources that hold its parts (`part = "1/2"`)
    [qa]                            # answer-level metrics for questions with answers (gradfuse.eval.qa)
    context_k = [3, 5]
    generate = ["rrf", "gro/draft"]
    [engines.arguana]               # this source served in place by an engine (the data above, loaded there):
    kind = "milvus"                 # any kind of gradfuse.sources.engines, with its keys; paths relative to
    uri = "../.gradfuse/bench/engines/milvus.db"   # this file. The baseline drops these tables.
    collection = "arguana"
    [quick]                         # `--quick`: overrides for a small, fast variant (checked in CI)
    sources = ["scifact"]
    source_options = { part = "1/3" }  # added to every source's table: a third of each corpus
    split = { sample = 5, dev = 3 }

Methods are any registered method (`gradfuse.methods`), `<method>/<target>` for the scoring-LM methods
(`gro/query`, `gradient/draft`, `loo/gold`, ...), `single:*` for every source alone, and three that only an
evaluation can run because they need relevance judgements: `static-best` (the single source best on the dev
queries), `learned-fusion` (per-source weights optimised by ranx on the dev queries) and `oracle-origin` (RRF over the
sources that hold the query's relevant documents: the upper bound of any router).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gradfuse.config import ConfigError, engine_settings
from gradfuse.eval.qa import QASettings
from gradfuse.ingest.parts import parse_part, part_of
from gradfuse.methods import LM_METHODS, TARGET_METHODS, check_method
from gradfuse.rerank import TARGETS
from gradfuse.sources import SourceSpec
from gradfuse.embedding.encoder import DEFAULT_ENCODER

EVALUATION_METHODS = ("static-best", "learned-fusion", "oracle-origin")
DERIVED_ROWS = (":prior", ":alone")  # a stage-2 method's pool order, and its score without the prior


@dataclass(frozen=True)
class EvalQuery:
    query_id: str  # namespaced by its set: "<set>/<id>"
    text: str
    query_set: str
    split: str  # "dev" or "test"
    answers: tuple[str, ...] = ()
    lm: bool = False  # in the subsample the scoring-LM methods run on
    fold: int | None = None  # with k-fold cross-fitting: the fold it is tested in
    position: int = 0  # in its set's shuffled sample of its split (the LM subsample is the first positions)


@dataclass
class QuerySet:
    name: str
    path: Path
    origin: dict[str, str | tuple[str, ...]]  # qrels doc-id prefix ("" for all) → source holding those documents,
    # or the sources holding its parts
    qrels_file: str = "qrels.tsv"
    queries_file: str = "queries.jsonl"
    answer_filter: dict[str, Any] = field(default_factory=dict)  # keep queries whose fields equal these values
    lm_sample: int | None = None  # this set's test queries in the LM subsample (None: the benchmark's [lm] sample)
    parts: dict[str, tuple[int, int]] = field(default_factory=dict)  # a parted origin source → (its part, of n)

    def source_of(self, doc_id: str) -> str | None:
        for prefix in sorted(self.origin, key=len, reverse=True):
            if doc_id.startswith(prefix):
                held = self.origin[prefix]
                return next((s for s in ([held] if isinstance(held, str) else held)
                             if s not in self.parts or part_of(doc_id, self.parts[s][1]) == self.parts[s][0]), None)
        return None


@dataclass
class Benchmark:
    name: str
    file: Path
    data: Path
    workspace: Path
    sources: dict[str, SourceSpec]
    query_sets: dict[str, QuerySet]
    methods: list[str]
    metrics: list[str]
    retrieval: str = "bm25"
    encoder: str = DEFAULT_ENCODER
    depth: int = 100
    k: int = 100
    seed: int = 0
    sample: int = 100
    dev: int = 30
    folds: int = 0  # > 0: cross-fitting over k folds of the sample instead of a separate dev sample
    lm_sample: int = 10
    lm_dev_sample: int = 5
    oracle_sample: int | None = None  # loo and loo-greedy on the first this many LM queries of each set (None: all)
    lm_options: dict[str, Any] = field(default_factory=dict)  # RerankSettings fields for every LM method
    shared_collection: bool = False  # sources rank one collection (runs of one corpus): judge by doc id alone
    fusion_step: float = 0.25  # ranx's weight grid for learned-fusion
    fusion_norm: str = "zmuv"
    description: str = ""
    quick: bool = False
    tuning_metric: str = "ndcg@10"  # what dev tuning maximises (a ranx metric)
    headline: str | None = None  # the metric of the paired tests and plots (default: the first metric)
    qa: QASettings | None = None  # answer-level metrics (`gradfuse.eval.qa`) when the file has a [qa] section
    set_tables: list[str] = field(default_factory=list)  # query sets with their own LM-subsample table
    # LM methods' failures on these metrics (value 0) are compared with UPR's (default: the headline metric)
    overlap_metrics: list[str] = field(default_factory=list)
    # Sources an engine serves in place (`[engines.NAME]`: its settings, sources/engines.py); a source of the same
    # name in `sources` says what was loaded there. Without them, every source is gradfuse's own index.
    engines: dict[str, Any] = field(default_factory=dict)

    @property
    def source_names(self) -> list[str]:
        return list(dict.fromkeys([*self.sources, *self.engines]))

    @property
    def headline_metric(self) -> str:
        return self.headline or self.metrics[0]

    def only(self, methods: list[str]) -> Benchmark:
        """This benchmark with a subset of its methods (in the file's order)."""
        chosen = [m.strip() for m in methods if m.strip()]
        unknown = [m for m in chosen if m not in self.methods]
        if unknown or not chosen:
            raise ConfigError(f"{self.file}: --methods names {', '.join(unknown) or 'none'}, not among the file's "
                              f"methods ({', '.join(self.methods)})")
        return replace(self, methods=[m for m in self.methods if m in chosen])

    def expand_methods(self) -> list[str]:
        methods: list[str] = []
        for method in self.methods:
            if method == "single:*":
                methods += [f"single:{s}" for s in self.source_names]
            else:
                methods.append(method)
        return methods


def base_method(method: str) -> str:
    """`gro/query` → `gro`, `upr:prior` and `upr:alone` (a stage-2 method's pool order and its score alone, see the
    runner) → `upr`; plain methods are their own base."""
    return _underived(method.split("/", 1)[0])


def method_target(method: str) -> str | None:
    return _underived(method.split("/", 1)[1]) if "/" in method else None


def _underived(name: str) -> str:
    for suffix in DERIVED_ROWS:
        name = name.removesuffix(suffix)
    return name


def is_lm_method(method: str) -> bool:
    return base_method(method) in LM_METHODS


def load_benchmark(path: Path, *, quick: bool = False) -> Benchmark:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"benchmark file {path} does not exist") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}") from error
    if "sources_from" in raw:  # share one declaration of the sources between benchmarks
        shared = Path(path).resolve().parent / raw.pop("sources_from")
        raw.setdefault("sources", tomllib.loads(shared.read_text())["sources"])
    overrides = raw.pop("quick", {})
    if quick:
        if not overrides:
            raise ConfigError(f"{path} has no [quick] section, so it has no --quick variant")
        raw = _apply_quick(raw, overrides, path)
    base = Path(path).resolve().parent
    data = _data_folder(base, raw.pop("data", "."))
    if not data.is_dir():
        raise ConfigError(f"{path}: the data folder {data} does not exist (set GRADFUSE_DATA to where the shared "
                          "data lives)")
    split, lm = raw.pop("split", {}), raw.pop("lm", {})
    sources = {name: _source_spec(name, dict(table), data, path) for name, table in raw.pop("sources", {}).items()}
    engines = {name: engine_settings(dict(table), base, f"{path} [engines.{name}]")
               for name, table in raw.pop("engines", {}).items() if not quick or name in sources}
    parts = {name: parse_part(spec.options["part"]) if "part" in spec.options else None
             for name, spec in sources.items()} | dict.fromkeys(engines)
    query_sets = {name: _query_set(name, dict(table), data, parts, path)
                  for name, table in raw.pop("queries", {}).items()}
    bench = Benchmark(
        name=raw.pop("name", Path(path).stem) + ("-quick" if quick else ""),
        file=Path(path),
        data=data,
        workspace=base / raw.pop("workspace", f"../.gradfuse/bench/{Path(path).stem}"),
        sources=sources,
        query_sets=query_sets,
        methods=list(raw.pop("methods", [])),
        metrics=list(raw.pop("metrics", ["ndcg@10", "recall@100", "mrr@10"])),
        retrieval=raw.pop("retrieval", "bm25"),
        encoder=raw.pop("encoder", DEFAULT_ENCODER),
        depth=int(raw.pop("depth", 100)),
        k=int(raw.pop("k", 100)),
        seed=int(raw.pop("seed", 0)),
        sample=int(split.pop("sample", 100)),
        dev=int(split.pop("dev", 30)),
        folds=int(split.pop("folds", 0)),
        lm_sample=int(lm.pop("sample", 10)),
        lm_dev_sample=int(lm.pop("dev_sample", 5)),
        oracle_sample=int(oracle) if (oracle := lm.pop("oracle_sample", None)) is not None else None,
        shared_collection=bool(raw.pop("shared_collection", False)),
        fusion_step=float(raw.pop("fusion_step", 0.25)),
        fusion_norm=raw.pop("fusion_norm", "zmuv"),
        description=raw.pop("description", ""),
        quick=quick,
        tuning_metric=raw.pop("tuning_metric", "ndcg@10"),
        headline=raw.pop("headline", None),
        set_tables=list(raw.pop("set_tables", [])),
        overlap_metrics=list(raw.pop("overlap_metrics", [])),
        engines=engines,
    )
    if "qa" in raw:
        try:
            bench.qa = QASettings(**raw.pop("qa"))
        except TypeError as error:
            raise ConfigError(f"{path} [qa]: {error}") from error
    bench.lm_options = lm
    for leftover, where in ((raw, ""), (split, " [split]")):
        if leftover:
            raise ConfigError(f"{path}{where}: unknown keys {sorted(leftover)}")
    if not bench.source_names or not query_sets or not bench.methods:
        raise ConfigError(f"{path}: a benchmark needs [sources.*], [queries.*] and a methods list")
    for method in bench.expand_methods():
        _check_method(method, bench.source_names, path)
    if unknown := [name for name in bench.set_tables if name not in query_sets]:
        raise ConfigError(f"{path}: set_tables names unknown query set(s) {unknown}")
    return bench


SHIPPED_DATA = "../../shared/data"  # what the benchmark files in benchmarks/ name: the checkout beside shared/


def _data_folder(base: Path, configured: str) -> Path:
    """GRADFUSE_DATA, else the configured folder (relative to the benchmark file); where that is the shipped
    files' own path and missing, the nearest `shared/data` beside a folder above the file (a checkout placed
    elsewhere next to the shared data), said on stderr. A folder a file names itself is never replaced: a
    misspelt path would measure other data without a word."""
    if os.environ.get("GRADFUSE_DATA"):
        return Path(os.environ["GRADFUSE_DATA"])
    folder = (base / configured).resolve()
    if folder.is_dir() or configured != SHIPPED_DATA:
        return folder
    nearby = [parent / "shared" / "data" for parent in base.parents if (parent / "shared" / "data").is_dir()]
    if nearby:
        print(f"note: {folder} does not exist; reading the data in {nearby[0]} (set GRADFUSE_DATA to choose)",
              file=sys.stderr)
    return nearby[0] if nearby else folder


def _apply_quick(raw: dict, overrides: dict, path: Path) -> dict:
    """The quick variant: a subset of the sources and query sets, and any top-level value replaced. Its [lm]
    sample holds for every query set (a set's own `lm_sample` is for the full run)."""
    raw = dict(raw)
    raw["queries"] = {n: {k: v for k, v in table.items() if k != "lm_sample"}
                      for n, table in raw.get("queries", {}).items()}
    for key, value in overrides.items():
        if key == "sources":
            raw["sources"] = {n: raw["sources"][n] for n in value}
        elif key == "source_options":  # every source of the variant built smaller (a part, a run's depth)
            raw["sources"] = {n: {**table, **value} for n, table in raw["sources"].items()}
        elif key == "queries":
            raw["queries"] = {n: raw["queries"][n] for n in value}
        elif isinstance(value, dict):
            raw[key] = {**raw.get(key, {}), **value}
        else:
            raw[key] = value
    return raw


def _check_method(method: str, sources: list[str], path: Path) -> None:
    base, target = base_method(method), method_target(method)
    if base in EVALUATION_METHODS:
        return
    try:
        check_method(base, sources)
    except ValueError as error:
        raise ConfigError(f"{path}: {error}") from error
    if target is not None and (base not in TARGET_METHODS or target not in TARGETS):
        raise ConfigError(f"{path}: {method!r}: only {', '.join(TARGET_METHODS)} take a target "
                          f"({', '.join(TARGETS)})")


def _source_spec(name: str, table: dict, data: Path, path: Path) -> SourceSpec:
    try:
        kind, source_path = table.pop("kind"), table.pop("path")
    except KeyError as error:
        raise ConfigError(f"{path} [sources.{name}]: missing {error}") from error
    for key in ("corpus", "queries"):  # run sources name their corpus and queries inside the data folder too
        if key in table:
            table[key] = str(data / table[key])
    return SourceSpec(name=name, kind=kind, path=str(data / source_path), options=table)


def _query_set(name: str, table: dict, data: Path, sources: dict[str, tuple[int, int] | None], path: Path
               ) -> QuerySet:
    """`sources`: every source's name → its part of a shared collection, if it holds one."""
    origin = table.pop("origin", name if name in sources else {})  # none needed when sources share a collection
    origin = {"": origin} if isinstance(origin, (str, list)) else dict(origin)
    origin = {prefix: held if isinstance(held, str) else tuple(held) for prefix, held in origin.items()}
    named = [s for held in origin.values() for s in ([held] if isinstance(held, str) else held)]
    unknown = [s for s in named if s not in sources]
    if unknown:
        raise ConfigError(f"{path} [queries.{name}]: origin names unknown source(s) {unknown}")
    for held in origin.values():
        if not isinstance(held, str) and sorted(sources[s] or (0, 0) for s in held) != \
                [(i, len(held)) for i in range(1, len(held) + 1)]:
            raise ConfigError(f"{path} [queries.{name}]: origin {list(held)} must be the sources holding parts "
                              f"1/{len(held)} to {len(held)}/{len(held)} of one collection (`part`)")
    query_set = QuerySet(name, data / table.pop("path", name), origin,
                         qrels_file=table.pop("qrels", "qrels.tsv"), queries_file=table.pop("file", "queries.jsonl"),
                         answer_filter=dict(table.pop("where", {})),
                         lm_sample=int(own) if (own := table.pop("lm_sample", None)) is not None else None,
                         parts={s: sources[s] for s in named if sources[s] is not None})
    if table:
        raise ConfigError(f"{path} [queries.{name}]: unknown keys {sorted(table)}")
    return query_set


def read_qrels(query_set: QuerySet) -> dict[str, dict[str, int]]:
    """The shared layout's qrels (`query_id<TAB>doc_id<TAB>relevance`, no header), query ids not yet namespaced."""
    judged: dict[str, dict[str, int]] = {}
    with open(query_set.path / query_set.qrels_file, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise ConfigError(f"{query_set.path / query_set.qrels_file}:{line_number}: expected 3 tab-separated "
                                  "fields (query id, doc id, relevance)")
            judged.setdefault(fields[0], {})[fields[1]] = int(fields[2])
    return judged


def sample_queries(bench: Benchmark, query_set: QuerySet, judged: dict[str, dict[str, int]],
                   usable: Callable[[str], bool] = lambda query_id: True) -> list[EvalQuery]:
    """Shuffle the judged queries that are `usable` with the seed; the first `sample` are test queries, the next
    `dev` dev queries. A set too small for both keeps the same test : dev proportion, so every set contributes to
    both. Unusable queries are dropped before sampling, so the LM subsample and the folds keep their sizes."""
    records = []
    with open(query_set.path / query_set.queries_file, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                if str(record["id"]) in judged and usable(str(record["id"])) and \
                        all(record.get(k) == v for k, v in query_set.answer_filter.items()):
                    records.append(record)
    random.Random(f"{bench.seed}/{query_set.name}").shuffle(records)
    if bench.folds:  # every query is a test query once; values are tuned on the other folds
        test, dev = records[: bench.sample], []
    elif len(records) >= bench.sample + bench.dev:
        test, dev = records[: bench.sample], records[bench.sample : bench.sample + bench.dev]
    else:
        dev_count = round(len(records) * bench.dev / (bench.sample + bench.dev))
        dev, test = records[:dev_count], records[dev_count:]
    queries = []
    lm_test = bench.lm_sample if query_set.lm_sample is None else query_set.lm_sample
    for split, chosen, lm_count in (("test", test, lm_test), ("dev", dev, bench.lm_dev_sample)):
        for position, record in enumerate(chosen):
            answers = record.get("answers") or []
            queries.append(EvalQuery(
                query_id=f"{query_set.name}/{record['id']}", text=record["text"], query_set=query_set.name,
                split=split, answers=tuple(str(a) for a in (answers if isinstance(answers, list) else [answers])),
                lm=position < lm_count, fold=position % bench.folds if bench.folds else None, position=position,
            ))
    return queries
