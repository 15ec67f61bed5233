"""What a benchmark run leaves behind: results.md, results.json and PNG plots in results/<bench>/ (committed), and
one TREC run per method in a runs folder that is not committed (a federated run set is over 100 MB of text)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gradfuse.eval.benchmark import EVALUATION_METHODS, base_method, is_lm_method
from gradfuse.eval.record import write_json
from gradfuse.eval.runner import Evaluation
from gradfuse.methods import CONFIGURED, METHOD_SPECS
from gradfuse.rerank.base import RerankSettings
from gradfuse.eval.stats import mean_interval, paired_difference, per_query
from gradfuse.sources.engines import engine_kind
from gradfuse.sources.run import trec_id

# Every method is tested against each of these that ran, paired, on the headline metric.
BASELINES = ("dense", "rrf", "static-best", "upr", "relevance", "cross-encoder")
LM_ONLY_METRICS = ("nll@", "em", "f1")  # measured on the scoring-LM subsample only


def summarise(evaluation: Evaluation) -> dict:
    """Two tables: every cheap method on all test queries, and every method on the LM subsample."""
    bench = evaluation.bench
    methods = [m for m in bench.expand_methods() if m in evaluation.outcomes]
    methods += [m for m in evaluation.outcomes if m not in methods]  # derived rows: <method>:prior
    test = [q.query_id for q in evaluation.split("test")]
    lm_test = [q.query_id for q in evaluation.split("test", lm=True)]
    tables = [{"name": "all test queries", "queries": len(test),
               "rows": _rows(evaluation, [m for m in methods if not is_lm_method(m)], test)}]
    overlap = {}
    if any(is_lm_method(m) for m in methods):
        tables.append({"name": "scoring-LM subsample of the test queries", "queries": len(lm_test),
                       "rows": _rows(evaluation, methods, lm_test, lm_metrics=True), "plot": "lm_subsample"})
        for query_set in bench.set_tables:
            own = [q for q in lm_test if q.startswith(f"{query_set}/")]
            tables.append({"name": f"scoring-LM subsample: {query_set}", "queries": len(own),
                           "rows": _rows(evaluation, methods, own, lm_metrics=True), "plot": f"lm_{query_set}"})
        overlap = _failures_vs_upr(evaluation, methods, lm_test)
    per_set = {}
    for query in evaluation.queries:
        counts = per_set.setdefault(query.query_set, {"test": 0, "dev": 0, "lm_test": 0, "lm_dev": 0})
        counts[query.split] += 1
        counts[f"lm_{query.split}"] += int(query.lm)
    return {
        "benchmark": bench.name,
        "description": bench.description,
        "file": str(bench.file),
        "commit": evaluation.commit,
        "machine": evaluation.machine,
        "wall_seconds": round(evaluation.wall_seconds, 1),
        "retrieval": "precomputed runs" if all(s.kind == "run" for s in bench.sources.values()) else bench.retrieval,
        "engines": {name: engine_kind(settings) for name, settings in bench.engines.items()},
        "depth": bench.depth,
        "metrics": bench.metrics,
        "headline": bench.headline_metric,
        "tuning_metric": bench.tuning_metric,
        "queries": per_set,
        "sources": {b["name"]: b["documents"] for b in evaluation.builds},
        "indexes_cached": all(b["status"] == "unchanged" for b in evaluation.builds),
        "retrieval_ms_p50": round(1000 * float(np.median(list(evaluation.retrieval_seconds.values()))), 2),
        "failures": evaluation.failures,
        "tuned": evaluation.tuned,
        "tables": tables,
        "source_choice": _source_choice(evaluation),
        "failures_vs_upr": overlap,
    }


def _failures_vs_upr(evaluation: Evaluation, methods: list[str], query_ids: list[str]) -> dict:
    """metric → method → how often it and UPR fail (value 0) on the same LM-subsample queries, and the mean of the
    better of the two per query: where both fail together, no mix of the two can help."""
    bench = evaluation.bench
    if "upr" not in evaluation.outcomes:
        return {}
    every = {m: _metric_values(evaluation, m, [q for q in query_ids if q in evaluation.outcomes[m]], bench.metrics,
                               True) for m in methods if is_lm_method(m)}
    result = {}
    for metric in bench.overlap_metrics or [bench.headline_metric]:
        values = {m: by_metric.get(metric, {}) for m, by_metric in every.items()}
        upr, table = values.get("upr", {}), {}
        for method, by_query in values.items():
            shared = [q for q in by_query if q in upr]
            if method == "upr" or not shared:
                continue
            a, b = np.array([by_query[q] for q in shared]), np.array([upr[q] for q in shared])
            table[method] = {"queries": len(shared), "both_fail": int(((a == 0) & (b == 0)).sum()),
                             "only_upr_fails": int(((a > 0) & (b == 0)).sum()),
                             "only_method_fails": int(((a == 0) & (b > 0)).sum()),
                             "upr": round(float(b.mean()), 4), "method": round(float(a.mean()), 4),
                             "better_of_two": round(float(np.maximum(a, b).mean()), 4)}
        result[metric] = table
    return result


def _metric_values(evaluation: Evaluation, method: str, query_ids: list[str], metrics: list[str],
                   lm_metrics: bool) -> dict:
    """metric → query id → value: ranx's document metrics, then the answer-level ones where they apply."""
    values = per_query(evaluation.qrels, evaluation.outcomes[method], query_ids, metrics)
    wanted = set(query_ids)
    for metric, by_query in evaluation.extra.get(method, {}).items():
        if lm_metrics or not metric.startswith(LM_ONLY_METRICS):
            values[metric] = {q: v for q, v in by_query.items() if q in wanted}
    return values


def _rows(evaluation: Evaluation, methods: list[str], query_ids: list[str], *, lm_metrics: bool = False) -> list[dict]:
    """A method is judged on the queries it ran on: the oracles run on the first few LM queries of each set only
    (`[lm] oracle_sample`), and a missing ranking must not count as an empty one."""
    bench = evaluation.bench
    ran = {m: [q for q in query_ids if q in evaluation.outcomes[m]] for m in methods}
    values = {m: _metric_values(evaluation, m, ran[m], bench.metrics, lm_metrics) for m in methods}
    headline = bench.headline_metric
    rows = []
    for method in methods:
        outcomes, query_ids = evaluation.outcomes[method], ran[method]
        row = {"method": method, "queries": len(query_ids)}
        if signal := stage2_signal(bench, method):
            row["scorer"] = signal
        for metric, by_query in values[method].items():
            row[metric] = {**mean_interval(list(by_query.values())), "queries": len(by_query)}
        for baseline in BASELINES:
            if baseline in values and baseline != method and headline in values[method]:
                shared = [q for q in values[method][headline] if q in values[baseline].get(headline, {})]
                row[f"vs {baseline}"] = paired_difference([values[method][headline][q] for q in shared],
                                                          [values[baseline][headline][q] for q in shared])
        precision, recall = _selection_quality(evaluation, outcomes, query_ids)
        row["source_precision"], row["source_recall"] = round(precision, 3), round(recall, 3)
        seconds = [outcomes[q].seconds for q in query_ids if q in outcomes and outcomes[q].seconds is not None]
        row["ranking_ms_p50"] = round(1000 * float(np.median(seconds)), 1) if seconds else None
        rows.append(row)
    return rows


def stage2_signal(bench, method: str) -> str | None:
    """The stage-2 signal a method's row ran: its own scorer, or for `gro` the one its [lm] scorer names (else the
    default, `[rerank] scorer`); None for a method without stage 2."""
    scorer = METHOD_SPECS.get(base_method(method), METHOD_SPECS["dense"]).scorer
    if scorer == CONFIGURED:
        return bench.lm_options.get("scorer") or RerankSettings().scorer
    return scorer


def _table_metrics(table: dict) -> list[str]:
    """Every metric some row of the table has, in first-seen order."""
    seen: dict[str, None] = {}
    for row in table["rows"]:
        seen.update((k, None) for k, v in row.items() if isinstance(v, dict) and "ci95" in v)
    return list(seen)


def _selection_quality(evaluation: Evaluation, outcomes: dict, query_ids: list[str]) -> tuple[float, float]:
    """Mean precision and recall of the sources a method drew on against the query's origin sources."""
    precision, recall = [], []
    for query_id in query_ids:
        chosen, origin = set(outcomes[query_id].chosen), set(evaluation.origins[query_id])
        precision.append(len(chosen & origin) / len(chosen) if chosen else 0.0)
        recall.append(len(chosen & origin) / len(origin))
    return float(np.mean(precision)), float(np.mean(recall))


def _source_choice(evaluation: Evaluation) -> dict:
    """For each stage-1 method: query set → source → share of its test queries for which the source was chosen."""
    choice = {}
    for method in evaluation.outcomes:
        if base_method(method) not in ("select", "gro"):
            continue
        table: dict[str, dict[str, float]] = {}
        queries = [q for q in evaluation.split("test") if q.query_id in evaluation.outcomes[method]]
        for query_set in evaluation.bench.query_sets:
            own = [q for q in queries if q.query_set == query_set]
            if own:
                table[query_set] = {s: round(sum(s in evaluation.outcomes[method][q.query_id].chosen for q in own)
                                             / len(own), 3) for s in evaluation.bench.source_names}
        choice[method] = table
    return choice


def write_results(evaluation: Evaluation, out: Path, command: str, runs: Path) -> dict:
    summary = summarise(evaluation)
    summary.update(command=command, runs=str(runs), finished=True)
    write_json(out / "results.json", summary, indent=2)
    _write_runs(evaluation, runs)
    plots = _plot(evaluation, summary, out)
    (out / "results.md").write_text(_markdown(summary, plots))
    return summary


def write_partial(evaluation: Evaluation, out: Path, command: str) -> None:
    """results.json of a run not finished yet (`"finished": false`), with what it measured so far: a run stopped
    half-way leaves it; the finished run replaces it, with results.md and the plots."""
    write_json(out / "results.json", {**summarise(evaluation), "command": command, "finished": False}, indent=2)


def _write_runs(evaluation: Evaluation, folder: Path) -> None:
    """One TREC run file per method (`qid Q0 docid rank score tag`), test queries only, real document ids (an id
    with whitespace percent-encoded: `trec_id`).
    Written directly: ranx's Run.save reads its numba dictionaries one item at a time (minutes for 20 methods)."""
    folder.mkdir(parents=True, exist_ok=True)
    test = [q.query_id for q in evaluation.split("test")]
    for method, outcomes in evaluation.outcomes.items():
        name = method.replace("/", "-").replace(":", "-")
        with open(folder / f"{name}.trec", "w") as handle:
            for query_id in test:
                for rank, (key, score) in enumerate(outcomes[query_id].ranking if query_id in outcomes else [], 1):
                    handle.write(f"{trec_id(query_id)} Q0 {trec_id(key)} {rank} {score:.6g} {name}\n")


def _plot(evaluation: Evaluation, summary: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    headline = evaluation.bench.headline_metric
    for table in summary["tables"]:
        rows = [r for r in table["rows"] if headline in r]
        fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2))
        means = [r[headline]["mean"] for r in rows]
        errors = np.array([[r[headline]["mean"] - r[headline]["ci95"][0], r[headline]["ci95"][1] - r[headline]["mean"]]
                           for r in rows]).T
        colours = ["tab:orange" if is_lm_method(r["method"]) or base_method(r["method"]) == "select" else
                   "tab:gray" if r["method"] in EVALUATION_METHODS else "tab:blue" for r in rows]
        ax.barh(range(len(rows)), means, xerr=errors, color=colours, capsize=2)
        ax.set_yticks(range(len(rows)), [r["method"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"{headline} (mean, 95% bootstrap interval)")
        ax.set_title(f"{summary['benchmark']}: {table['name']} ({table['queries']} queries)", fontsize=9)
        fig.tight_layout()
        name = f"{headline.replace('@', '_at_')}{'_' + table['plot'] if 'plot' in table else ''}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)
    choice = summary["source_choice"]
    if choice:
        sources = evaluation.bench.source_names
        height = 0.45 * len(evaluation.bench.query_sets) + 2
        fig, axes = plt.subplots(1, len(choice), figsize=(4.2 * len(choice), height), squeeze=False)
        for ax, (method, table) in zip(axes[0], choice.items()):
            sets = list(table)
            grid = np.array([[table[s][source] for source in sources] for s in sets])
            ax.imshow(grid, vmin=0, vmax=1, cmap="Blues", aspect="auto")
            ax.set_xticks(range(len(sources)), sources, rotation=60, ha="right", fontsize=7)
            ax.set_yticks(range(len(sets)), sets, fontsize=7)
            ax.set_title(f"{method}: share chosen", fontsize=9)
            ax.set_xlabel("source")
            ax.set_ylabel("query origin")
        fig.tight_layout()
        fig.savefig(out / "source_choice.png", dpi=110)
        plt.close(fig)
        made.append("source_choice.png")
    scatter = _gradient_vs_loo(evaluation)
    if scatter:
        fig, ax = plt.subplots(figsize=(4.5, 4))
        ax.scatter([p[0] for p in scatter], [p[1] for p in scatter], s=6, alpha=0.5)
        ax.set_xlabel("gradient score (gate)")
        ax.set_ylabel("leave-one-out loss increase")
        fig.tight_layout()
        fig.savefig(out / "gradient_vs_loo.png", dpi=110)
        plt.close(fig)
        made.append("gradient_vs_loo.png")
    return made


def _gradient_vs_loo(evaluation: Evaluation) -> list[tuple[float, float]]:
    """(gradient, LOO) per candidate where both ran on the same query with the same target."""
    points = []
    for loo_method in [m for m in evaluation.outcomes if base_method(m) == "loo"]:
        gradient_method = "gradient" + loo_method[3:]
        if gradient_method not in evaluation.outcomes:
            continue
        for query_id, loo in evaluation.outcomes[loo_method].items():
            gradient = evaluation.outcomes[gradient_method].get(query_id)
            if gradient is None:
                continue
            by_key = {row["key"]: row for row in gradient.head}
            # The gradient's own score (rerank:reader_gate with the default estimator, rerank:gate, ...).
            points += [(by_key[row["key"]][gradient.score_key], row["rerank:loo"]) for row in loo.head
                       if row["key"] in by_key]
    return points


def _without_grids(value):
    if isinstance(value, dict):
        return {k: _without_grids(v) for k, v in value.items() if k != "dev_grid"}
    return value


def _markdown(summary: dict, plots: list[str]) -> str:
    headline = summary["headline"]
    lines = [
        f"# Benchmark `{summary['benchmark']}`",
        "",
        summary["description"].strip(),
        "",
        f"Command: `{summary['command']}` · commit {summary['commit']} · machine: {summary['machine']} · "
        f"wall time {summary['wall_seconds'] / 60:.1f} min "
        f"({'indexes and embeddings cached' if summary['indexes_cached'] else 'including building the indexes'}). "
        f"TREC runs of the test queries: `{summary['runs']}` (made by the command, not committed).",
        "",
        f"Retrieval in every source: {summary['retrieval']}, depth {summary['depth']}; retrieval p50 "
        f"{summary['retrieval_ms_p50']} ms a query (all sources concurrently).",
        "",
        "| query set | test | dev | LM test | LM dev |",
        "|---|---:|---:|---:|---:|",
        *[f"| {name} | {c['test']} | {c['dev']} | {c['lm_test']} | {c['lm_dev']} |"
          for name, c in summary["queries"].items()],
        "",
        "Sources (documents): " + ", ".join(f"{name} ({count})" for name, count in summary["sources"].items()),
        "",
    ]
    for table in summary["tables"]:
        metrics = _table_metrics(table)
        baselines = [b for b in BASELINES if any(f"vs {b}" in r for r in table["rows"])]
        lines += [
            f"## {table['name']} ({table['queries']} queries)",
            "",
            "Mean with 95% bootstrap interval; Δ and p: paired randomisation test on "
            f"{headline} against each baseline; sources P/R: precision/recall of the sources a method drew on "
            "against the sources holding the query's relevant documents; ms: ranking time a query (p50), after "
            "retrieval.",
            "",
            "| method | " + " | ".join(metrics) + " | " + " | ".join(f"Δ vs {b} (p)" for b in baselines)
            + " | sources P/R | ms |",
            "|---|" + "---:|" * (len(metrics) + len(baselines) + 2),
        ]
        for row in table["rows"]:
            cells = [f"{row[m]['mean']:.3f} [{row[m]['ci95'][0]:.3f}, {row[m]['ci95'][1]:.3f}]" if m in row else "–"
                     for m in metrics]
            cells += [f"{row[f'vs {b}']['delta']:+.3f} ({row[f'vs {b}']['p']:.3g})" if f"vs {b}" in row else "–"
                      for b in baselines]
            cells += [f"{row['source_precision']:.2f}/{row['source_recall']:.2f}", f"{row['ranking_ms_p50'] or '–'}"]
            shown = f"{row['method']} ({row['scorer']})" if row.get("scorer") else row["method"]
            lines.append(f"| {shown} | " + " | ".join(cells) + " |")
        lines.append("")
    for metric, table in summary["failures_vs_upr"].items():
        lines += [f"## Where UPR and each LM method fail ({metric} = 0, scoring-LM subsample)", "",
                  "Both: queries both get wrong; better of two: the mean if each query took the better of the "
                  "method and UPR (the ceiling of any mix of the two).", "",
                  "| method | queries | both fail | only UPR fails | only method fails | UPR | method | "
                  "better of two |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {m} | {r['queries']} | {r['both_fail']} | {r['only_upr_fails']} | {r['only_method_fails']} | "
                  f"{r['upr']:.3f} | {r['method']:.3f} | {r['better_of_two']:.3f} |" for m, r in table.items()]
        lines.append("")
    lines += ["## Tuned on the dev queries only", ""]
    for name, value in summary["tuned"].items():
        lines.append(f"- **{name}**: `{json.dumps(_without_grids(value))}`")
    lines.append("\n(The dev scores of every grid point are in results.json.)")
    lines.append("")
    if summary["source_choice"]:
        lines += ["## Which sources stage 1 chose, by query origin (test queries)", ""]
        for method, table in summary["source_choice"].items():
            sources = list(next(iter(table.values())))
            lines += [f"**{method}**", "", "| origin | " + " | ".join(sources) + " |",
                      "|---|" + "---:|" * len(sources)]
            lines += [f"| {s} | " + " | ".join(f"{v:.2f}" for v in row.values()) + " |" for s, row in table.items()]
            lines.append("")
    failures = summary["failures"]
    lines += ["## Source failures", "",
              f"{len(failures)} queries saw a failed source." if failures else "No source failed on any query.", ""]
    lines += ["## Plots", "", *[f"![{p}]({p})" for p in plots], ""]
    return "\n".join(lines)
