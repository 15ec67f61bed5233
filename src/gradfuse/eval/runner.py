"""Run every method of a benchmark over the same retrieved candidates, tune what needs tuning on dev queries only.

Order of work: build (or reuse) the sources; sample the query sets; retrieve once per query; rank with every
cheap method; tune on the dev queries (best static source, ranx-learned fusion weights, stage-1 settings); run the
scoring-LM methods on their subsample, caching each query's outcome on disk so an interrupted run resumes; tune the
gradient/prior mix on the dev subsample. Nothing tuned ever sees a test query.

Longer than the rest (about 460 lines) because those steps share one run's state (its queries, retrieved lists,
caches and the tuned record) and are read in that order; tuning.py, outcome.py and report.py hold what stands alone.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from gradfuse.candidate import Candidate
from gradfuse.config import Config, SourceSettings
from gradfuse.eval import tuning
from gradfuse.eval.outcome import Outcome
from gradfuse.eval.qa import qa_metrics
from gradfuse.eval.record import commit_id, machine_description
from gradfuse.eval.benchmark import (
    EVALUATION_METHODS,
    Benchmark,
    EvalQuery,
    base_method,
    is_lm_method,
    method_target,
    read_qrels,
    sample_queries,
)
from gradfuse.execute import Executor
from gradfuse.methods import CONFIGURED, METHOD_SPECS, MIXED_METHODS, STAGE1_METHODS, TARGET_METHODS
from gradfuse.selection import ALL_PAIRS_UP_TO, SelectionSettings, choose_sources, every_redundancy
from gradfuse.federation.federated import FederatedResult
from gradfuse.workspace import SearchResult, Workspace

ORACLE_METHODS = ("loo", "loo-greedy")  # the expensive references `[lm] oracle_sample` limits


@dataclass
class Evaluation:
    bench: Benchmark
    queries: list[EvalQuery]
    qrels: dict[str, dict[str, int]]  # query id → judged document key → relevance
    origins: dict[str, list[str]]  # query id → sources holding its relevant documents
    outcomes: dict[str, dict[str, Outcome]]  # method → query id → outcome
    tuned: dict[str, object]
    retrieval_seconds: dict[str, float]
    failures: dict[str, list[str]]  # query id → "source: reason" for sources that failed on it
    builds: list[dict]
    passages: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)  # key → source, id, title, text
    extra: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # method → metric → query → value
    answers: dict[str, dict[str, str]] = field(default_factory=dict)  # method → query → generated answer
    lm_runs: dict[tuple[str, str], dict[str, Outcome]] = field(default_factory=dict)  # see _LMRuns
    wall_seconds: float = 0.0
    machine: str = ""
    commit: str = ""

    def split(self, name: str, *, lm: bool = False) -> list[EvalQuery]:
        return [q for q in self.queries if q.split == name and (q.lm or not lm)]


def run_benchmark(bench: Benchmark, *, progress: bool = True, executor: Executor | None = None,
                  dev_only: bool = False, checkpoint: Callable[[Evaluation], None] | None = None) -> Evaluation:
    """`executor`: where the scoring-LM methods' passes run (gradfuse.execute: this process, or scorer replicas on
    a Ray cluster); the samples, the outcomes cache and every number are the same either way. `dev_only`: the dev
    queries alone, for what they tune (gradfuse tune). `checkpoint`: called with the evaluation so far once the
    cheap methods have run and after each scoring-LM method (a run stopped later keeps what they measured)."""
    started, commit = time.perf_counter(), commit_id()  # the code that runs is the code checked out now
    ws = benchmark_workspace(bench, executor)
    builds = [asdict(ws.index(spec, progress=progress)) for name, spec in bench.sources.items()
              if name not in bench.engines]
    queries, qrels, origins = queries_and_qrels(bench)
    if dev_only:
        queries = [q for q in queries if q.split == "dev"]
    evaluation = Evaluation(bench, queries, qrels, origins, {}, {}, {}, {}, builds, machine=machine_description(),
                            commit=commit)

    def reached() -> None:
        evaluation.wall_seconds = time.perf_counter() - started
        if checkpoint is not None:
            checkpoint(evaluation)

    methods = bench.expand_methods()
    cheap = [m for m in methods if not is_lm_method(m) and m not in EVALUATION_METHODS and m != "select"]

    retrieved: dict[str, FederatedResult] = {}
    profiles: dict[str, tuple[dict, dict]] = {}  # stage 1's relevance and redundancy per query, for tuning
    for query in tqdm(queries, desc=f"{bench.name}: retrieve and rank", disable=not progress):
        federated = ws.retrieve(query.text, sources=bench.source_names, depth=bench.depth)
        retrieved[query.query_id] = federated
        evaluation.retrieval_seconds[query.query_id] = federated.wall_seconds
        for candidates in federated.ranked_lists.values():
            evaluation.passages.update((_judged_key(bench, c), (c.source, c.doc_id, c.title, c.text))
                                       for c in candidates)
        if federated.failures:
            evaluation.failures[query.query_id] = [f"{f.source}: {f.detail}" for f in federated.failures]
        for method in cheap:
            _record(evaluation, method, query, _rank(ws, bench, query, federated, method))
        decision = _rank(ws, bench, query, federated, "select").selection
        profiles[query.query_id] = (decision.relevance, _every_pair(ws, federated, decision))

    groups = _tuning_groups(evaluation)
    selections = _run_evaluation_methods(evaluation, ws, retrieved, profiles, groups, methods)
    reached()
    for method in [m for m in methods if is_lm_method(m)]:
        _run_lm_method(evaluation, ws, retrieved, profiles, method, groups, selections, progress)
        reached()
    if bench.qa is not None:
        qa_metrics(evaluation, bench.qa, bench.lm_options.get("model", "smollm2"),
                   bench.lm_options.get("doc_tokens", 128), progress, dtype=bench.lm_options.get("dtype", "auto"))
    evaluation.wall_seconds = time.perf_counter() - started
    return evaluation


def benchmark_workspace(bench: Benchmark, executor: Executor | None = None) -> Workspace:
    """The workspace a benchmark runs in: its indexes, and the sources its engines serve."""
    engines = {name: SourceSettings(engine=settings) for name, settings in bench.engines.items()}
    return Workspace(Config(workspace=bench.workspace, depth=bench.depth, k=bench.k, retrieval=bench.retrieval,
                            encoder=bench.encoder, sources=engines), executor=executor)


def queries_and_qrels(bench: Benchmark):
    """The sampled queries (test and dev) with a relevant document in reach, their judged keys and origins."""
    queries, qrels, origins = [], {}, {}
    for query_set in bench.query_sets.values():
        judged = read_qrels(query_set)
        reachable = {query_id: _judged_keys(bench, query_set, judgements) for query_id, judgements in judged.items()}

        def usable(query_id: str) -> bool:  # a query with nothing relevant in reach says nothing about any method
            return any(v > 0 for v in reachable[query_id][0].values())

        for query in sample_queries(bench, query_set, judged, usable):
            qrels[query.query_id], origin = reachable[query.query_id.split("/", 1)[1]]
            origins[query.query_id] = sorted(origin)
            queries.append(query)
    return queries, qrels, origins


def _judged_keys(bench: Benchmark, query_set, judged: dict[str, int]) -> tuple[dict[str, int], set[str]]:
    """One query's judgements keyed as candidates are judged, and the sources holding its relevant documents."""
    if bench.shared_collection:  # every source ranks the one collection: each can hold any document
        return dict(judged), set(bench.source_names)
    keys, origin = {}, set()
    for doc_id, relevance in judged.items():
        source = query_set.source_of(doc_id)
        if source is None:
            continue  # a judged document in no benchmarked source (e.g. a quick variant's dropped source)
        keys[f"{source}/{doc_id}"] = relevance
        if relevance > 0:
            origin.add(source)
    return keys, origin


def _every_pair(ws: Workspace, federated: FederatedResult, decision) -> dict[str, dict[str, float]]:
    """Stage 1's redundancy of every pair of sources, for tuning to replay another lambda (the decision holds
    every pair only up to ALL_PAIRS_UP_TO sources; beyond, it read only the pairs it needed)."""
    if len(federated.ranked_lists) <= ALL_PAIRS_UP_TO:
        return decision.redundancy
    m = ws.config.selection.candidates
    return every_redundancy({s: ws.query.embed(c[:m]) for s, c in federated.ranked_lists.items()},
                            ws.config.selection.redundancy)


def _rank(ws: Workspace, bench: Benchmark, query: EvalQuery, federated: FederatedResult, method: str,
          **options) -> SearchResult:
    return ws.rank(query.text, federated.copy(), method=method, k=bench.k, **options)


def _judged_key(bench: Benchmark, candidate: Candidate) -> str:
    return candidate.doc_id if bench.shared_collection else candidate.key


def outcome_of(bench: Benchmark, result: SearchResult) -> Outcome:
    """The judged ranking of one ranked result (document keys as the qrels name them)."""
    if result.selection is not None:
        chosen = result.selection.sources
    else:
        chosen = [result.method.removeprefix("single:")] if result.method.startswith("single:") else \
            sorted(result.ranked_lists)
    if bench.shared_collection and result.method.startswith("single:"):
        # One run of the collection is judged as it stands, as trec_eval judges its file: copies of one text
        # under other ids are merged for the generator and the user, not for scoring (SPLADE++ on DL21 lost 934
        # of 5,300 candidates to merging, and 0.022 nDCG@10 against its published score).
        ranked = result.ranked_lists.get(chosen[0], [])
    elif bench.shared_collection:  # each candidate, then the copies of its text under other ids
        ranked = [copy for candidate in result.candidates for copy in (candidate, *candidate.merged)]
    else:
        ranked = result.candidates
    keys = list(dict.fromkeys(_judged_key(bench, c) for c in ranked))[: bench.k]  # several runs of one collection: once
    ranking = [(key, float(len(keys) - position)) for position, key in enumerate(keys)]
    return Outcome(ranking, chosen, result.timings["ranking"])


def _record(evaluation: Evaluation, method: str, query: EvalQuery, result: SearchResult | Outcome) -> None:
    outcome = result if isinstance(result, Outcome) else outcome_of(evaluation.bench, result)
    evaluation.outcomes.setdefault(method, {})[query.query_id] = outcome


def _restricted(federated: FederatedResult, sources) -> FederatedResult:
    """The same retrieval, as if only `sources` had been asked (a source with no list contributes nothing)."""
    return FederatedResult({s: federated.ranked_lists.get(s, []) for s in sources}, [], {}, federated.wall_seconds)


def _tuning_groups(evaluation: Evaluation) -> list[tuple[list[str], list[str]]]:
    """(dev query ids, query ids the values tuned on them apply to). A holdout split has one group; with k folds
    each fold is ranked with values tuned on the other folds (cross-fitting), so every query is tested once."""
    if not evaluation.bench.folds:
        return [([q.query_id for q in evaluation.split("dev")], [q.query_id for q in evaluation.queries])]
    folds = [[q.query_id for q in evaluation.queries if q.fold == f] for f in range(evaluation.bench.folds)]
    return [([q for other in folds if other is not fold for q in other], fold) for fold in folds]


def _tuned(evaluation: Evaluation, name: str, group: int, value: dict) -> None:
    """One value per tuning group: a plain entry for a holdout split, `fold <i>` entries with folds."""
    if evaluation.bench.folds:
        evaluation.tuned.setdefault(name, {})[f"fold {group}"] = value
    else:
        evaluation.tuned[name] = value


def _run_evaluation_methods(evaluation, ws, retrieved, profiles, groups, methods) -> list[SelectionSettings]:
    """static-best, learned-fusion, oracle-origin and select: the ones whose settings come from dev queries.
    Returns stage 1's tuned settings per group (gro uses them too)."""
    bench = evaluation.bench
    singles = {s: evaluation.outcomes.get(f"single:{s}") for s in bench.source_names}
    by_id = {q.query_id: q for q in evaluation.queries}
    if "static-best" in methods and any(v is None for v in singles.values()):
        raise ValueError("static-best needs every single source among the methods (add 'single:*')")
    if "oracle-origin" in methods:
        for query in evaluation.queries:
            subset = _restricted(retrieved[query.query_id], evaluation.origins[query.query_id])
            _record(evaluation, "oracle-origin", query, _rank(ws, bench, query, subset, "rrf"))
    memo: dict[tuple[str, tuple[str, ...], str], Outcome] = {}

    def rank_over(query_id: str, sources: tuple[str, ...], fusion: str) -> Outcome:
        """What `select` ranks when stage 1 chooses `sources` (memoised for the grid)."""
        if (query_id, sources, fusion) not in memo:
            subset = _restricted(retrieved[query_id], sources)
            memo[query_id, sources, fusion] = outcome_of(bench, _rank(ws, bench, by_id[query_id], subset, fusion))
        return memo[query_id, sources, fusion]

    selections = []
    for group, (dev, apply_to) in enumerate(groups):
        if "static-best" in methods:
            best, scores = tuning.best_static_source(evaluation.qrels, singles, dev, bench.tuning_metric)
            _tuned(evaluation, "static-best", group, {"source": best, f"dev_{bench.tuning_metric}": scores})
            for query_id in apply_to:
                evaluation.outcomes.setdefault("static-best", {})[query_id] = singles[best][query_id]
        if "learned-fusion" in methods:
            weights, fused = tuning.learned_fusion(evaluation.qrels, singles, dev, apply_to, bench.fusion_norm,
                                                   bench.fusion_step, bench.tuning_metric)
            _tuned(evaluation, "learned-fusion", group, {"weights": weights, "norm": bench.fusion_norm,
                                                         "step": bench.fusion_step})
            evaluation.outcomes.setdefault("learned-fusion", {}).update(fused)
        settings = SelectionSettings()
        if "select" in methods or any(base_method(m) in STAGE1_METHODS for m in methods):
            settings, grid = tuning.selection_settings(evaluation.qrels, profiles, dev, rank_over,
                                                        bench.tuning_metric)
            _tuned(evaluation, "selection", group, {"settings": asdict(settings), "dev_grid": grid})
        selections.append(settings)
        if "select" in methods:
            for query_id in apply_to:
                result = _rank(ws, bench, by_id[query_id], retrieved[query_id], "select", selection=settings)
                _record(evaluation, "select", by_id[query_id], result)
            # Soft selection beside hard, tuned on the same dev queries: the row `select:soft`.
            def rank_soft(query_id: str, soft: SelectionSettings) -> Outcome:
                return outcome_of(bench, _rank(ws, bench, by_id[query_id], retrieved[query_id], "select",
                                               selection=soft))

            soft, grid = tuning.soft_selection_settings(evaluation.qrels, dev, rank_soft, settings,
                                                        bench.tuning_metric)
            _tuned(evaluation, "soft selection", group, {"settings": asdict(soft), "dev_grid": grid})
            for query_id in apply_to:
                _record(evaluation, "select:soft", by_id[query_id], rank_soft(query_id, soft))
    return selections


def _run_lm_method(evaluation, ws, retrieved, profiles, method, groups, selections, progress) -> None:
    """A stage-2 method on the LM subsample. Per tuning group: each pool in `[lm] pools` runs on the dev queries and
    the best (after tuning its mix) is run on the group's queries; the mix of score and prior is tuned on dev too,
    and so is the score itself where a scorer keeps variants of it (`rerank:attention@<layers>`). With
    `[lm] upr_prior`, the dev grid also tries UPR's values over the same pool as the prior (from the `upr` method's
    runs of the same queries; a method mixed with them costs UPR's time too). Besides the method, `<method>:prior`
    records the chosen pool's own order on the same queries (what the score has to improve on) and `<method>:alone`
    the score without the prior (what it says by itself)."""
    bench = evaluation.bench
    base, target = base_method(method), method_target(method) or "draft"
    lm = dict(bench.lm_options)
    pools, upr_prior = lm.pop("pools", [lm.get("pool", "cosine")]), lm.pop("upr_prior", False)
    if METHOD_SPECS[base].scorer != CONFIGURED:  # only gro reads [lm] scorer; the others' runs stay as they were
        lm.pop("scorer", None)
    mixes = base in MIXED_METHODS
    options = {**lm, "prior_weight": 0.0, "mix": "zsum", "prior": "pool"}
    if base in TARGET_METHODS:
        options["target"] = target
    runs = _LMRuns(evaluation, ws, retrieved, profiles, progress)
    with_upr = upr_prior and mixes and base != "upr" and base in STAGE1_METHODS

    def run(pool: str, selection, query_ids: list[str]) -> dict[str, Outcome]:
        outcomes = runs.outcomes(method, {**options, "pool": pool}, selection, query_ids)
        if with_upr:  # the upr method's own runs: gro's [lm] scorer is no setting of UPR's
            upr_options = {key: value for key, value in lm.items() if key != "scorer"}
            upr = runs.outcomes("upr", {**upr_options, "prior_weight": 0.0, "mix": "zsum", "prior": "pool",
                                        "pool": pool}, selection, list(outcomes))
            outcomes = {q: _with_upr_prior(outcome, upr[q]) for q, outcome in outcomes.items()}
        return outcomes

    priors = ["prior", "prior:upr"] if with_upr else ["prior"]
    for group, ((dev, apply_to), selection) in enumerate(zip(groups, selections)):
        if not mixes:  # the oracles and the set methods: their own order, as they rank it
            pool = pools[0] if base in ORACLE_METHODS else _own_order_pool(
                evaluation, method, group, pools, lambda p: run(p, selection, dev), dev)
            evaluation.outcomes.setdefault(method, {}).update(run(pool, selection, apply_to))
            continue
        choices = {}
        for pool in pools:
            outcomes = run(pool, selection, dev)
            point, score, grid = tuning.best_mix(evaluation.qrels, outcomes, dev, _score_keys(outcomes), priors,
                                                 bench.tuning_metric)
            choices[pool] = {"pool": pool, **point, f"dev_{bench.tuning_metric}": round(score, 4), "dev_grid": grid}
        pool = max(choices, key=lambda p: (choices[p][f"dev_{bench.tuning_metric}"], -pools.index(p)))
        chosen = choices[pool]
        _tuned(evaluation, f"{method} stage 2", group, {"chosen": {k: v for k, v in chosen.items() if k != "dev_grid"},
                                                        "pools": choices})
        for query_id, outcome in run(pool, selection, apply_to).items():
            mixed = tuning.mix_prior(outcome, chosen["score"], chosen["prior"], chosen["mix"], chosen["value"])
            if chosen["prior"] == "prior:upr":
                mixed = replace(mixed, seconds=outcome.seconds + outcome.head[0]["upr_seconds"])
            evaluation.outcomes.setdefault(method, {})[query_id] = mixed
            evaluation.outcomes.setdefault(f"{method}:prior", {})[query_id] = replace(tuning.mix_prior(
                outcome, chosen["score"], "prior", "within", 0), seconds=None)
            evaluation.outcomes.setdefault(f"{method}:alone", {})[query_id] = tuning.mix_prior(
                outcome, chosen["score"], chosen["prior"], "zsum", 0.0)


def _own_order_pool(evaluation, method: str, group: int, pools: list[str], run_dev, dev: list[str]) -> str:
    """The pool under which a method that ranks by its own order (no mix) scores best on the dev queries; ties go
    to the earlier pool. With one pool there is nothing to run: it is recorded as chosen."""
    metric = evaluation.bench.tuning_metric
    if len(pools) == 1:
        _tuned(evaluation, f"{method} stage 2", group, {"chosen": {"pool": pools[0]}, "pools": {}})
        return pools[0]
    scores = {}
    for pool in pools:
        outcomes = run_dev(pool)
        lm_dev = [q for q in dev if q in outcomes]
        tuning.need_dev(lm_dev, f"{method}'s pool")
        scores[pool] = tuning.mean_score(evaluation.qrels, outcomes, lm_dev, metric)
    pool = max(pools, key=lambda p: (scores[p], -pools.index(p)))
    _tuned(evaluation, f"{method} stage 2", group, {
        "chosen": {"pool": pool, f"dev_{metric}": round(scores[pool], 4)},
        "pools": {p: {"pool": p, f"dev_{metric}": round(score, 4)} for p, score in scores.items()}})
    return pool


class _LMRuns:
    """The outcomes of stage-2 runs at prior weight 0, by method, settings and run key, each computed once per
    benchmark (and cached on disk, `_LMCache`). A run key is the query and, for stage-1 methods, the sources stage
    1 chooses for it with a group's settings, so a query tested in one fold and used as dev in another is ranked
    with each fold's own choice (values tuned with a query must not rank it), and runs once when choices agree."""

    def __init__(self, evaluation, ws, retrieved, profiles, progress: bool):
        self.evaluation, self.ws, self.retrieved, self.profiles, self.progress = (evaluation, ws, retrieved,
                                                                                  profiles, progress)
        self.done = evaluation.lm_runs  # (method, settings fingerprint) → run key → outcome

    def outcomes(self, method: str, settings: dict, selection, query_ids: list[str]) -> dict[str, Outcome]:
        bench, base = self.evaluation.bench, base_method(method)
        target = settings.get("target")
        by_id = {q.query_id: q for q in self.evaluation.queries}
        cache = _LMCache(bench, method, {**settings, "depth": bench.depth, "retrieval": bench.retrieval,
                                         "k": bench.k})
        done = self.done.setdefault((method, cache.fingerprint), {})

        def key(query_id: str) -> str:
            if base not in STAGE1_METHODS:
                return query_id
            return f"{query_id} " + ",".join(sorted(choose_sources(*self.profiles[query_id], selection).sources))

        todo = [by_id[q] for q in query_ids if by_id[q].lm and key(q) not in done and (
                bench.oracle_sample is None or base not in ORACLE_METHODS or by_id[q].position < bench.oracle_sample)]
        for query in todo:
            if target == "gold" and not query.answers:
                raise ValueError(f"{method}: query {query.query_id} has no reference answer for the gold target")
        cached = {q.query_id: cache.get(key(q.query_id)) for q in todo}

        def rank(query: EvalQuery) -> tuple[Outcome, bool]:
            if cached[query.query_id] is not None:
                return cached[query.query_id], False
            result = _rank(self.ws, bench, query, self.retrieved[query.query_id], base, selection=selection,
                           gold=query.answers[0] if query.answers else None, **settings)
            outcome = outcome_of(bench, result)
            outcome.target, outcome.loss = result.rerank.target, result.rerank.loss
            outcome.head = [{"key": _judged_key(bench, c), **c.scores} for c in result.rerank.ranked]
            outcome.score_key = result.rerank.score_key
            return outcome, True

        # With scorer replicas on a cluster, several queries are in flight; results come back here in order
        # and only this thread writes the cache.
        for query, (outcome, fresh) in zip(todo, tqdm(self.ws.executor.map(rank, todo), total=len(todo),
                                                      desc=f"{bench.name}: {method} ({settings['pool']} pool)",
                                                      disable=not self.progress)):
            if fresh:
                cache.put(key(query.query_id), outcome)
            done[key(query.query_id)] = outcome
        return {q: done[key(q)] for q in query_ids if key(q) in done}


def _with_upr_prior(outcome: Outcome, upr: Outcome) -> Outcome:
    """The outcome with UPR's value of each head candidate as `prior:upr` (both runs scored the same pool)."""
    values = {row["key"]: row["rerank:upr"] for row in upr.head}
    head = [{**row, "prior:upr": values[row["key"]], "upr_seconds": upr.seconds} for row in outcome.head]
    return replace(outcome, head=head)


def _score_keys(outcomes: dict[str, Outcome]) -> list[str]:
    """The score a scorer ranks by, then its variants (`<score>@<variant>`), which dev tuning may choose instead."""
    key = _head_key(outcomes)
    first = next(iter(outcomes.values())).head if outcomes else []
    return [key] + [name for name in (first[0] if first else {}) if name.startswith(f"{key}@")]


def _head_key(outcomes: dict[str, Outcome]) -> str:
    return next(iter(outcomes.values())).score_key if outcomes else "rerank:final"


class _LMCache:
    """One JSON line per run key (the query, and for stage-1 methods the sources chosen) and method, under a
    fingerprint of every setting that changes the outcome: a rerun resumes."""

    def __init__(self, bench: Benchmark, method: str, settings: dict):
        folder = bench.workspace / "eval-cache" / bench.name
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / (method.replace("/", "-").replace(":", "-") + ".jsonl")
        engines = sorted((name, repr(engine)) for name, engine in bench.engines.items())  # what they hold
        self.fingerprint = hashlib.sha256(json.dumps([settings, code_version(), *([engines] if engines else [])], sort_keys=True).encode()
                                          ).hexdigest()[:16]
        self.stored: dict[str, Outcome] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                record = json.loads(line)
                if record.pop("fingerprint") == self.fingerprint:
                    query_id = record.pop("query_id")
                    record["ranking"] = [tuple(pair) for pair in record["ranking"]]
                    self.stored[query_id] = Outcome(**record)

    def get(self, query_id: str) -> Outcome | None:
        return self.stored.get(query_id)

    def put(self, query_id: str, outcome: Outcome) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"fingerprint": self.fingerprint, "query_id": query_id, **asdict(outcome)}) + "\n")


# What computes a stage-2 outcome: a change in any of it must not reuse outcomes cached before it.
_OUTCOME_CODE = ("candidate.py", "methods.py", "workspace.py", "execute", "fusion", "rerank", "selection", "sources",
                 "ingest", "embedding", "indexing", "federation", "lm")


@functools.cache
def code_version() -> str:
    """A hash of the code that computes an outcome (gradfuse's own files, as they are on disk)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in _OUTCOME_CODE:
        for path in sorted([package / name] if name.endswith(".py") else (package / name).rglob("*.py")):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]

