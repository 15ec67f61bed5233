"""`gradfuse tune --write` end to end on shared data (benchmark 1's quick variant: cranfield, hotpotqa and pubmedqa
as the workspace's own sources, their dev queries as the user's labelled questions): the settings it writes keep
the file's own lines, read back as a valid configuration, and `gradfuse search` with them reproduces the dev
score their comment states."""

from __future__ import annotations

import datetime
import re
import shutil

import pytest
from typer.testing import CliRunner

from test_eval import BENCHMARKS, needs_data

from gradfuse import Workspace
from gradfuse.cli import app
from gradfuse.config import load_config
from gradfuse.eval import load_benchmark
from gradfuse.eval.benchmark import is_lm_method
from gradfuse.eval.runner import outcome_of, queries_and_qrels
from gradfuse.eval.tuning import mean_score

pytestmark = pytest.mark.usefixtures("bench_workspaces")  # see conftest.py


@needs_data
@pytest.mark.slow
def test_tune_writes_dev_choices_that_search_then_uses_and_reproduces(tmp_path):
    config = tmp_path / "gradfuse.toml"
    config.write_text('# my own workspace\nworkspace = "ws"\n\n[generator]\nmax_new_tokens = 64  # keep me\n')
    # The quick benchmark's embeddings where its test has run: the sources are still read and built, not re-embedded.
    embedded = BENCHMARKS.parent / ".gradfuse" / "bench" / "quick-sources" / "cache" / "embeddings.sqlite"
    if embedded.is_file():
        (tmp_path / "ws" / "cache").mkdir(parents=True)
        shutil.copy(embedded, tmp_path / "ws" / "cache" / "embeddings.sqlite")
    # --write-lm-settings: the benchmark's float32 scorer and its n, which the dev score held under
    shown = CliRunner().invoke(app, ["tune", str(BENCHMARKS / "federated.toml"), "--quick", "--write",
                                     "--write-lm-settings", "--config", str(config)], terminal_width=300)
    assert shown.exit_code == 0, shown.output
    assert "[selection] max_sources = " in shown.output and "[defaults] method = " in shown.output  # as printed
    assert re.search(r"\[selection\] soft_weight = .*soft selection, dev ndcg@10 \d\.\d{4} against hard's", shown.output)
    text = config.read_text()
    assert text.startswith("# my own workspace") and "max_new_tokens = 64  # keep me" in text  # the file's own lines
    today = datetime.date.today().isoformat()
    for section in ("[selection]", "[rerank]", "[defaults]"):
        assert section in text, text
    # the sources' fusion weights only where learned fusion is the method chosen: they would change every other
    # method's fusion and stage 2's pool, which dev measured without them
    assert "[sources." not in text or re.search(r'^method = "combsum(-z)?" # tuned', text, re.M), text
    assert re.search(rf'method = "[^"]+" # tuned: .*dev ndcg@10 \d\.\d{{4}}.*{today}', text), text

    settings = load_config(config)
    assert settings.max_new_tokens == 64 and (tmp_path / "ws" / "sources" / "cranfield").is_dir()
    method = settings.method
    comment = re.search(r'method = "[^"]+" # tuned: dev ndcg@10 (\d\.\d{4})', text)
    bench = load_benchmark(BENCHMARKS / "federated.toml", quick=True)
    queries, qrels, _ = queries_and_qrels(bench)
    dev = [q for q in queries if q.split == "dev" and (q.lm or not is_lm_method(method))]
    # A search with no method named: the defaults written, with the sources' weights and stage 1's settings.
    with Workspace.open(config) as workspace:
        outcomes = {q.query_id: outcome_of(bench, workspace.search(q.text, k=bench.k)) for q in dev}
    assert comment and mean_score(qrels, outcomes, [q.query_id for q in dev], "ndcg@10") == pytest.approx(
        float(comment.group(1)), abs=5e-5), (method, text)


def test_a_set_method_tuned_on_dev_writes_its_pool_and_no_mix():
    """conditional ranks by its own order: tune writes the pool dev chose, the benchmark's stage-2 settings, and
    none of the mix's keys (they would not describe what dev measured)."""
    from types import SimpleNamespace

    from gradfuse.eval.tune import _stage2_values

    bench = SimpleNamespace(lm_options={"pools": ["cosine", "rrf"], "n": 10, "set_rounds": 3, "upr_prior": True})
    evaluation = SimpleNamespace(bench=bench, tuned={"conditional stage 2": {"chosen": {"pool": "rrf",
                                                                                         "dev_ndcg@10": 0.5}}})
    values = _stage2_values(evaluation, "conditional", "dev")
    assert {value.key: value.value for value in values} == {"pool": "rrf", "n": 10, "set_rounds": 3}
    # sizes and limits are the benchmark's, not tuned: written only with --write-lm-settings
    assert {value.key for value in values if value.lm_setting} == {"n", "set_rounds"}


def test_tune_writes_gros_signal_only_for_gro():
    """A benchmark pins gro's signal ([lm] scorer); tune writes it as [rerank] scorer when gro won on dev, and not
    when another method did (it would change what the user's gro ranks by)."""
    from types import SimpleNamespace

    from gradfuse.eval.tune import _stage2_values

    chosen = {"pool": "cosine", "score": "rerank:reader_gate", "prior": "prior", "mix": "zsum", "value": 2.0}
    bench = SimpleNamespace(lm_options={"pools": ["cosine"], "n": 10, "scorer": "gradient"})
    evaluation = SimpleNamespace(bench=bench, tuned={"gro/query stage 2": {"chosen": chosen},
                                                     "upr stage 2": {"chosen": {**chosen, "score": "rerank:upr"}}})
    by_gro = {v.key: v.value for v in _stage2_values(evaluation, "gro/query", "dev")}
    assert by_gro["scorer"] == "gradient" and by_gro["prior_weight"] == 2.0 and by_gro["target"] == "query"
    assert "scorer" not in {v.key for v in _stage2_values(evaluation, "upr", "dev")}


def test_write_tuned_writes_the_real_file_keeps_its_mode_and_replaces_it_only_with_valid_text(tmp_path):
    """Through a link the target is written (not a new file beside the link); a 0600 file stays 0600; a read-only
    file is refused; a control character from a benchmark's name cannot break the TOML; a value the configuration
    rejects leaves the file as it was."""
    import os
    import stat

    from gradfuse.config import ConfigError
    from gradfuse.eval.tune import TunedValue, write_tuned

    real = tmp_path / "private" / "gradfuse.toml"
    real.parent.mkdir()
    real.write_text('workspace = "ws"\n\n[generator]\napi_key_env = "MY_KEY"\n')
    os.chmod(real, 0o600)
    link = tmp_path / "gradfuse.toml"
    link.symlink_to(real)

    def check(path):
        return load_config(path)

    write_tuned(link, [TunedValue("selection", "threshold", 0.25, "bench\x1b[2J\nname.toml, dev 0.5")], check)
    assert link.is_symlink() and stat.S_IMODE(real.stat().st_mode) == 0o600
    text = real.read_text()
    assert "\x1b" not in text and load_config(link).selection.threshold == 0.25
    assert sorted(p.name for p in real.parent.iterdir()) == ["gradfuse.toml"]  # no temporary file left

    with pytest.raises(ConfigError):
        write_tuned(link, [TunedValue("selection", "threshold", "high", "not a number")], check)
    assert real.read_text() == text and sorted(p.name for p in real.parent.iterdir()) == ["gradfuse.toml"]

    os.chmod(real, 0o444)
    with pytest.raises(ValueError, match="read-only"):
        write_tuned(link, [TunedValue("selection", "threshold", 0.3, "dev")], check)
    assert real.read_text() == text
