"""`gradfuse tune BENCH.toml --write`: a benchmark's dev queries, run over the workspace's own sources, choose
the settings that `gradfuse search` and `serve` then use, and they are written into the workspace's
gradfuse.toml, each with a comment giving its dev score and the date.

What is chosen (each from what the benchmark's methods tune on their dev queries, as `gradfuse eval` does):
- the sources' fusion weights (learned-fusion: ranx's weighted CombSUM over normalised scores, which is what
  `combsum-z` (z-scores) or `combsum` (min-max) computes with those weights);
- stage 1's redundancy weight, threshold, source limit and fusion ([selection]);
- stage 2's pool, mix and its weight, and target ([rerank]), of the best stage-2 method;
- the default method ([defaults] method): the best on the dev queries of the methods a search can run by name.
  A scoring-LM method runs on the LM subsample of the dev queries only, so it becomes the default only where it
  beats the best of the others on those same queries;
- and what they hold under: the encoder, retrieval and depth the benchmark ranked with.
"""

from __future__ import annotations

import datetime
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gradfuse.eval.benchmark import EVALUATION_METHODS, Benchmark, base_method, is_lm_method, method_target
from gradfuse.eval.runner import Evaluation, run_benchmark
from gradfuse.eval.tuning import mean_score
from gradfuse.execute import Executor
from gradfuse.methods import CONFIGURED, METHOD_SPECS
from gradfuse.rerank.base import RerankSettings

ORACLES = ("oracle-origin", "loo", "loo-greedy")  # they read the relevance judgements or the gold answer
_FUSION_OF_NORM = {"zmuv": "combsum-z", "min-max": "combsum"}


@dataclass(frozen=True)
class TunedValue:
    section: str  # "defaults", "selection", "rerank" or "sources.<name>"
    key: str
    value: object
    why: str  # the comment written next to it
    # A benchmark's own [lm] setting that the dev scores held under (a model, a size, a limit), not a value tuned
    # on them: a benchmark file must not set the workspace's model path or limits unless asked to.
    lm_setting: bool = False


# [rerank] keys tuned on the dev queries (or choices among named alternatives): written by `tune --write`. The
# benchmark's other [lm] keys (model, n, doc_tokens, max_pass_tokens, set_rounds, dtype, ...) only with
# --write-lm-settings.
TUNED_RERANK_KEYS = {"pool", "prior", "mix", "prior_weight", "within_m", "attention_layers", "scorer", "target",
                     "estimator", "length_normalise", "both_orders"}


def tune(bench: Benchmark, workspace: Path, *, progress: bool = True,
         executor: Executor | None = None) -> tuple[Evaluation, list[TunedValue]]:
    """Build the benchmark's sources in `workspace` (the workspace's own, by their names), run its methods on
    its dev queries only, and return what they chose."""
    if bench.folds:
        raise ValueError(f"{bench.file}: tune needs a held-out dev split ([split] dev), not folds")
    evaluation = run_benchmark(replace(bench, workspace=workspace), progress=progress, executor=executor,
                               dev_only=True)
    return evaluation, tuned_values(evaluation)


def tuned_values(evaluation: Evaluation) -> list[TunedValue]:
    bench, metric = evaluation.bench, evaluation.bench.tuning_metric
    dev = [q.query_id for q in evaluation.queries]
    lm_dev = [q.query_id for q in evaluation.queries if q.lm]
    source = f"{bench.file.name}, {len(dev)} dev queries, {datetime.date.today().isoformat()}"
    # What the tuned values hold under: how the sources were built and searched for the dev queries.
    values = [TunedValue("encoder", "model", bench.encoder, f"the sources' encoder ({source})"),
              TunedValue("defaults", "retrieval", bench.retrieval, f"as the dev queries were ranked ({source})"),
              TunedValue("defaults", "depth", bench.depth, f"as the dev queries were ranked ({source})")]
    if "selection" in evaluation.tuned:
        settings = evaluation.tuned["selection"]["settings"]
        score = max(point[metric] for point in evaluation.tuned["selection"]["dev_grid"])
        for key in ("redundancy_weight", "threshold", "max_sources", "fusion"):
            values.append(TunedValue("selection", key, settings[key], f"stage 1, dev {metric} {score:.4f} ({source})"))
    if "soft selection" in evaluation.tuned and "select" in evaluation.outcomes:
        soft = evaluation.tuned["soft selection"]["settings"]
        hard_score = mean_score(evaluation.qrels, evaluation.outcomes["select"], dev, metric)
        soft_score = mean_score(evaluation.qrels, evaluation.outcomes["select:soft"], dev, metric)
        # Written for `choice = "soft"`, not chosen: the method's written score is hard selection's, and a search
        # with the written defaults must reproduce it.
        why = f"soft selection, dev {metric} {soft_score:.4f} against hard's {hard_score:.4f} ({source})"
        values += [TunedValue("selection", key, soft[key], why) for key in ("soft_weight", "soft_margin")]
    scores = {method: mean_score(evaluation.qrels, outcomes, lm_dev if is_lm_method(method) else dev, metric)
              for method, outcomes in evaluation.outcomes.items() if _runnable(method, evaluation)}
    cheap = {m: s for m, s in scores.items() if not is_lm_method(m)}
    lm = {m: s for m, s in scores.items() if is_lm_method(m)}
    best = max(cheap, key=lambda m: (cheap[m], m)) if cheap else None
    why = f"dev {metric} {cheap[best]:.4f} ({source})" if best else ""
    if lm:
        best_lm = max(lm, key=lambda m: (lm[m], m))
        values += _stage2_values(evaluation, best_lm, f"{best_lm}, dev {metric} {lm[best_lm]:.4f} on "
                                                      f"{len(lm_dev)} LM dev queries ({source})")
        cheap_there = mean_score(evaluation.qrels, evaluation.outcomes[best], lm_dev, metric) if best else None
        if best is None or lm[best_lm] > cheap_there:
            why = (f"dev {metric} {lm[best_lm]:.4f} on the {len(lm_dev)} LM dev queries" +
                   (f", {best} {cheap_there:.4f} there" if best else "") + f" ({source})")
            best = best_lm
        else:
            why += f"; the best stage-2 method, {best_lm}, {lm[best_lm]:.4f} against {cheap_there:.4f} on its queries"
    if best == "learned-fusion":  # its weights are the method; every other method was measured without them
        score = mean_score(evaluation.qrels, evaluation.outcomes[best], dev, metric)
        values += [TunedValue(f"sources.{name}", "weight", weight, f"learned fusion, dev {metric} {score:.4f} ({source})")
                   for name, weight in evaluation.tuned[best]["weights"].items()]
    if best is not None:
        values.append(TunedValue("defaults", "method", _search_method(best, evaluation), why))
    return values


def _runnable(method: str, evaluation: Evaluation) -> bool:
    """Whether `gradfuse search --method` can run what `method` ranked by (an evaluation's derived rows and the
    oracles cannot)."""
    return ":" not in method.removeprefix("single:") and base_method(method) not in ORACLES and \
        (method not in EVALUATION_METHODS or method in ("static-best", "learned-fusion"))


def _search_method(method: str, evaluation: Evaluation) -> str:
    if method == "static-best":
        return f"single:{evaluation.tuned['static-best']['source']}"
    if method == "learned-fusion":  # its weights are written to the sources
        return _FUSION_OF_NORM[evaluation.tuned["learned-fusion"]["norm"]]
    return base_method(method)


SCORE_VARIANT_SETTINGS = {"rerank:attention": "attention_layers"}  # rerank:<score>@<variant> → [rerank] key


def _stage2_values(evaluation: Evaluation, method: str, why: str) -> list[TunedValue]:
    lm = evaluation.bench.lm_options
    chosen = evaluation.tuned[f"{method} stage 2"]["chosen"]
    values = [("pool", chosen["pool"])]
    if "mix" in chosen:  # the set methods rank by their own order: no mix to write
        weight = ("prior_weight", float(chosen["value"])) if chosen["mix"] == "zsum" else \
            ("within_m", int(chosen["value"]))
        # With [lm] upr_prior the dev grid also mixes with UPR's values over the pool ("prior:upr").
        values += [("prior", "upr" if chosen["prior"] == "prior:upr" else "pool"), ("mix", chosen["mix"]), weight]
    if "@" in chosen.get("score", ""):  # a variant of the score chosen on dev: the setting that selects it
        score, variant = chosen["score"].split("@", 1)
        values.append((SCORE_VARIANT_SETTINGS[score], variant))
    # The benchmark's own stage-2 settings (n, doc_tokens, estimator, ...): the dev score holds with them.
    values += [(key, value) for key, value in evaluation.bench.lm_options.items()
               if key not in ("pools", "pool", "upr_prior", "prior", "mix", "prior_weight", "within_m", "target",
                              "scorer")]
    if METHOD_SPECS[base_method(method)].scorer == CONFIGURED:  # gro's signal, as the benchmark ran it
        values.append(("scorer", lm.get("scorer", RerankSettings().scorer)))
    if method_target(method):
        values.append(("target", method_target(method)))
    return [TunedValue("rerank", key, value, why, lm_setting=key not in TUNED_RERANK_KEYS) for key, value in values]


def write_tuned(config_file: Path, values: list[TunedValue], check: Callable[[Path], object]) -> None:
    """Set each value in `config_file` (created if missing; its other keys and comments kept), with its comment.
    The file behind a link is the one written; its mode is kept; a read-only file is refused; the new text must
    pass `check` (reading it as a configuration) before it replaces the old one, at once."""
    import tomlkit

    target = config_file.resolve()
    mode = 0o600
    if target.exists():
        mode = stat.S_IMODE(target.stat().st_mode)
        if not mode & stat.S_IWUSR or not os.access(target, os.W_OK):
            raise ValueError(f"{config_file} is read-only: not written (make it writable, or tune into another "
                             "file with --config)")
    document = tomlkit.parse(target.read_text(encoding="utf-8")) if target.exists() else tomlkit.document()
    for value in values:
        table = document
        for part in value.section.split("."):
            if part not in table:
                table[part] = tomlkit.table(is_super_table=part == "sources")
            table = table[part]
        item = tomlkit.item(value.value)
        item.comment(_printable(f"tuned: {value.why}"))
        table[value.key] = item
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        os.fchmod(descriptor, mode)  # the umask does not loosen it
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(tomlkit.dumps(document))
        check(temporary)
        temporary.replace(target)
    finally:
        temporary.unlink(missing_ok=True)


def _printable(text: str) -> str:
    """A comment on one line: no control character from a file name may end it (or break the TOML)."""
    return "".join(character if character.isprintable() else "?" for character in text)
