import pytest

from gradfuse import Workspace
from gradfuse.config import ConfigError, load_config

from conftest import ASTRONOMY, write_jsonl


def test_toml_declares_sources_models_and_defaults_and_flags_override(tmp_path):
    write_jsonl(tmp_path / "data" / "astro.jsonl", ASTRONOMY)
    config_file = tmp_path / "gradfuse.toml"
    config_file.write_text(
        'workspace = "idx"\n'
        '[defaults]\nmethod = "concat"\nk = 2\ntimeout_s = 3\n'
        '[generator]\nmodel = "http://127.0.0.1:9/v1"\ncontext_k = 2\n'
        '[selection]\nredundancy_weight = 0.8\nmax_sources = 2\n'
        '[rerank]\nn = 12\nestimator = "grad_x_input"\ntarget = "query"\n'
        '[sources.astro]\nkind = "jsonl"\npath = "data/astro.jsonl"\nweight = 2.0\nretrieval = "bm25"\n'
    )
    config = load_config(config_file)
    assert config.workspace == tmp_path / "idx" and config.k == 2 and config.timeout_s == 3.0
    assert config.generator == "http://127.0.0.1:9/v1" and config.context_k == 2
    assert (config.selection.redundancy_weight, config.selection.max_sources) == (0.8, 2)
    assert (config.rerank.n, config.rerank.estimator, config.rerank.target) == (12, "grad_x_input", "query")
    assert config.sources["astro"].weight == 2.0 and config.sources["astro"].spec.kind == "jsonl"

    ws = Workspace(config)
    assert [r.status for r in ws.build_configured()] == ["built"]
    assert [r.status for r in ws.build_configured()] == ["unchanged"]
    result = ws.search("moons of the fourth planet")
    assert result.method == "concat" and len(result.candidates) == 2  # defaults from the file
    assert ws.source("astro").stats().retrieval == "bm25"  # per-source setting from the file
    assert len(ws.search("moons", k=1, method="rrf").candidates) == 1  # arguments override the file
    assert load_config(config_file, workspace=tmp_path / "other").workspace == tmp_path / "other"


@pytest.mark.parametrize(
    "text, message",
    [
        ("[defaults]\nfusoin = 'rrf'\n", "\\[defaults\\]: fusoin: Extra inputs are not permitted"),
        ("[defaults]\nk = 'ten'\n", "k: Input should be a valid integer"),
        ("[defaults]\nk = -3\n", "k: Input should be greater than or equal to 1"),
        ("[defaults]\ndepth = 1000000000000\n", "depth: Input should be less than or equal to 100000"),
        ("[defaults]\ntimeout_s = 'fast'\n", "timeout_s: Input should be a valid number"),
        ("[server]\ncors_origins = 'https://a.example'\n", "cors_origins: Input should be a valid tuple"),
        ("[server]\nport = 70000\n", "port: Input should be less than or equal to 65535"),
        ("[rerank]\nn = 0\n", "\\[rerank\\]: n: Input should be greater than or equal to 1"),
        ("[rerank]\nprior_weight = nan\n", "prior_weight: Input should be a finite number"),
        ("[sources.x]\nweight = nan\n", "\\[sources.x\\]: weight: Input should be a finite number"),
        ("[sources.x]\ntimeout_s = 'fast'\n", "\\[sources.x\\]: timeout_s: Input should be a valid number"),
        ("[generator]\ncite_first = 1\n", "cite_first: Input should be a valid boolean"),
        ("[sources.x]\nkind = 'beir'\n", "missing \\['path'\\]"),
        ("[sources.x]\nkind = 'sql'\npath = 'a'\n", "unknown kind 'sql'"),
        # a misspelt option would leave every file open to every reader: refused, not ignored
        ("[sources.x]\nkind = 'files'\npath = 'a'\n[sources.x.reader]\n'hr/*' = ['hr']\n",
         "'reader' is no option of kind 'files' \\(its options: chunk_words, .*readers"),
        ("[sources.x]\nkind = 'jsonl'\npath = 'a'\nreaders_feild = 'acl'\n", "'readers_feild' is no option of kind"),
        ("[sources.x]\nkind = 'files'\npath = 'a'\n[sources.x.readers]\n'/hr/*' = ['hr']\n",
         "readers pattern '/hr/\\*': patterns match paths inside the folder"),
        ("[sources.x]\nkind = 'files'\npath = 'a'\n[sources.x.readers]\n'hr/*' = ['h r']\n",
         "readers 'hr/\\*': invalid reader name 'h r'"),
        ("[defaults\n", "gradfuse.toml"),
        ("[rerank]\nestimator = 'magic'\n", "unknown estimator 'magic'"),
        ("[selection]\nlambda = 1\n", "\\[selection\\].*lambda"),
        ("[server]\nray_replicas = -1\n", "\\[server\\]: ray_replicas: Input should be greater than or equal to 0"),
        ("[routing]\nunscored_share = 1.5\n", "\\[routing\\]: unscored_share: Input should be less than or equal to 1"),
    ],
)
def test_config_errors_name_the_problem(tmp_path, text, message):
    (tmp_path / "gradfuse.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "gradfuse.toml")
