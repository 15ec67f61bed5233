"""The CLI as a user runs it: index, sources, search and ask, through Typer's runner in-process."""

import json

from typer.testing import CliRunner

from gradfuse.cli import app

from conftest import ASTRONOMY, COOKING, write_jsonl

runner = CliRunner()


def test_index_sources_search_from_the_command_line(tmp_path):
    ws = ["--workspace", str(tmp_path / "ws")]
    write_jsonl(tmp_path / "astro" / "corpus.jsonl", ASTRONOMY)
    write_jsonl(tmp_path / "cooking.jsonl", COOKING)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "tea.md").write_text("# Tea\nGreen tea is steeped at 80 degrees for two minutes.")

    assert runner.invoke(app, ["index", "beir", str(tmp_path / "astro"), "--source", "astro", *ws]).exit_code == 0
    assert runner.invoke(app, ["index", "jsonl", str(tmp_path / "cooking.jsonl"), "-s", "cooking", *ws]).exit_code == 0
    built = runner.invoke(app, ["index", "files", str(notes), "-s", "notes", *ws])
    assert built.exit_code == 0 and "built 1 documents" in built.output
    again = runner.invoke(app, ["index", "files", str(notes), "-s", "notes", *ws])
    assert "unchanged" in again.output

    listing = json.loads(runner.invoke(app, ["sources", "--json", *ws]).output)
    assert {(s["name"], s["kind"], s["documents"]) for s in listing} == {
        ("astro", "beir", 3), ("cooking", "jsonl", 3), ("notes", "files", 1)}

    found = runner.invoke(app, ["search", "green tea temperature", "--method", "concat", "--retrieval", "dense",
                                "--json", *ws])
    assert found.exit_code == 0, found.output
    result = json.loads(found.output)
    top = result["candidates"][0]
    assert (top["source"], top["doc_id"], top["native_rank"]) == ("notes", "tea.md#0", 1)
    assert 0 < top["scores"]["fusion:concat"] == top["native_score"] and result["failures"] == []

    table = runner.invoke(app, ["search", "Phobos", "--method", "concat", "--retrieval", "bm25", *ws])
    assert "astro" in table.output and "cooking/mars-copy@1" in table.output  # the merged duplicate is shown


def test_cli_errors_are_one_clear_line(tmp_path):
    ws = ["--workspace", str(tmp_path / "ws")]
    missing = runner.invoke(app, ["search", "anything", *ws])
    assert missing.exit_code == 2 and "no sources are built" in missing.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "text": "ok"}\n{"id": 2,\n')
    failed = runner.invoke(app, ["index", "jsonl", str(bad), "-s", "bad", *ws])
    assert failed.exit_code == 2 and "bad.jsonl:2: invalid JSON" in failed.output
    skipped = runner.invoke(app, ["index", "jsonl", str(bad), "-s", "bad", "--skip-malformed", *ws])
    assert skipped.exit_code == 0 and "skipped_malformed" in skipped.output
    unknown = runner.invoke(app, ["search", "ok", "--method", "magic", *ws])
    assert unknown.exit_code == 2 and "unknown method 'magic'" in unknown.output


def test_document_text_and_help_texts_are_printed_as_written(tmp_path):
    ws = ["--workspace", str(tmp_path / "ws")]
    write_jsonl(tmp_path / "odd.jsonl", [
        {"id": "passwd", "text": "root:x:0:0:root:/root:/bin/bash is the first line of the file"},
        {"id": "markup", "text": "Use [bold]loud[/bold] text and :smile: codes in the chat client"},
        {"id": "esc\x1b[2J\x07", "title": "\x1b]0;owned\x07", "text": "root line \x1b[2J\x1b[31m cleared"},
    ])
    assert runner.invoke(app, ["index", "jsonl", str(tmp_path / "odd.jsonl"), "-s", "odd", *ws]).exit_code == 0
    shown = runner.invoke(app, ["search", "root line file loud text smile", "--method", "concat", "--retrieval",
                                "bm25", *ws])
    assert shown.exit_code == 0, shown.output
    cells = "".join(line.strip("│ ") for line in shown.output.splitlines())  # table cells wrap over lines
    assert "root:x:0:0" in cells and "[bold]loud[/bold]" in cells and ":smile:" in cells, shown.output
    assert "❌" not in shown.output and "😄" not in shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output and "\\x1b[2J" in cells  # shown, not obeyed
    assert "[server]" in " ".join(runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output.split())


def test_ask_names_the_generator_and_its_size(tmp_path):
    ws = ["--workspace", str(tmp_path / "ws")]
    write_jsonl(tmp_path / "astro" / "corpus.jsonl", ASTRONOMY)
    assert runner.invoke(app, ["index", "beir", str(tmp_path / "astro"), "--source", "astro", *ws]).exit_code == 0
    asked = runner.invoke(app, ["ask", "Which planet has two moons?", "--method", "rrf", "-k", "2", *ws],
                          terminal_width=200)
    assert asked.exit_code == 0, asked.output  # extractive by default with the bundled model: it says why
    assert "passages' own sentences" in asked.output and "SmolLM2-135M" in asked.output
    assert 'answer = "generate"' in asked.output and "[generator] model" in asked.output  # how to get another
    written = runner.invoke(app, ["ask", "Which planet has two moons?", "--method", "rrf", "-k", "2", "--generator",
                                  "smollm2", "--max-new-tokens", "8", *ws], terminal_width=200)
    assert written.exit_code == 0, written.output
    assert "SmolLM2-135M" in written.output and "135M parameters" in written.output
    assert "[generator] model" in written.output


def test_serve_beyond_loopback_needs_a_key_or_an_explicit_opt_out(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADFUSE_API_KEY", raising=False)
    refused = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--workspace", str(tmp_path / "ws")],
                            terminal_width=200)
    assert refused.exit_code == 2 and "without an API key" in refused.output and "--insecure-no-key" in refused.output


def test_search_and_ask_default_to_select_and_an_unanswerable_question_says_not_found(tmp_path):
    ws = ["--workspace", str(tmp_path / "ws")]
    write_jsonl(tmp_path / "astro" / "corpus.jsonl", ASTRONOMY)
    write_jsonl(tmp_path / "cooking.jsonl", COOKING)
    assert runner.invoke(app, ["index", "beir", str(tmp_path / "astro"), "--source", "astro", *ws]).exit_code == 0
    assert runner.invoke(app, ["index", "jsonl", str(tmp_path / "cooking.jsonl"), "-s", "cooking", *ws]).exit_code == 0
    found = json.loads(runner.invoke(app, ["search", "Phobos and Deimos", "--json", *ws]).output)
    assert found["method"] == "select" and found["selection"]["chosen"][0]["source"] == "astro"
    asked = json.loads(runner.invoke(app, ["ask", "Which planet has the moons Phobos and Deimos?", "--json",
                                           *ws]).output)
    assert asked["method"] == "select" and not asked["abstained"] and "Phobos" in asked["answer"]
    missing = runner.invoke(app, ["ask", "What is the default TCP port of a PostgreSQL server?", *ws],
                            terminal_width=200)
    assert missing.exit_code == 0, missing.output
    assert "Not found in these sources." in missing.output and "too weak to answer from" in missing.output


def test_index_refuses_a_source_the_config_declares_otherwise(tmp_path):
    """`index` would build it without the config's options: its readers' files would be open to every key."""
    (tmp_path / "notes" / "hr").mkdir(parents=True)
    (tmp_path / "notes" / "hr" / "pay.md").write_text("# Pay\n\nSalaries are paid on the last working day.\n")
    config = tmp_path / "gradfuse.toml"
    config.write_text('workspace = "ws"\n[sources.notes]\nkind = "files"\npath = "notes"\n'
                      '[sources.notes.readers]\n"hr/*" = ["hr"]\n')
    refused = runner.invoke(app, ["index", "files", str(tmp_path / "notes"), "-s", "notes", "-c", str(config)])
    assert refused.exit_code == 2 and "source 'notes' is declared in the config" in refused.output
    said = " ".join(refused.output.split())  # as wrapped to the terminal's width
    assert "its options readers would be left out" in said and "gradfuse build" in said
    assert not (tmp_path / "ws" / "sources" / "notes").exists()
    assert runner.invoke(app, ["build", "-c", str(config)]).exit_code == 0
    other = runner.invoke(app, ["index", "files", str(tmp_path / "notes"), "-s", "other", "-c", str(config)])
    assert other.exit_code == 0  # a name the config does not declare is the command's own
    config.write_text('workspace = "ws"\n[sources.notes]\nkind = "files"\npath = "notes"\n[sources.lake]\n'
                      'kind = "lancedb"\nuri = "lake"\ntable = "t"\n')
    same = runner.invoke(app, ["index", "files", str(tmp_path / "notes"), "-s", "notes", "-c", str(config)])
    assert same.exit_code == 0  # as declared, the command's own chunking beside: nothing of the config is lost
    engine = runner.invoke(app, ["index", "files", str(tmp_path / "notes"), "-s", "lake", "-c", str(config)])
    assert engine.exit_code == 2 and "as a source an engine serves" in " ".join(engine.output.split())


def test_help_and_a_usage_error_import_none_of_the_pipeline():
    """`gradfuse --help` (and every command's usage) is read before anything is loaded: no numpy, no model runtime,
    no engine client, no workspace, no pydantic (issue 71: every command paid for all of them)."""
    import subprocess
    import sys

    probe = ("import sys\nfrom typer.main import get_command\nimport gradfuse.cli\nget_command(gradfuse.cli.app)\n"
             "print(' '.join(sorted(m for m in ('numpy', 'torch', 'onnxruntime', 'httpx', 'pydantic', "
             "'gradfuse.config', 'gradfuse.workspace', 'gradfuse.methods') if m in sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


def test_methods_lists_every_method_and_signal(tmp_path):
    from gradfuse.fusion import FUSION_METHODS
    from gradfuse.methods import METHOD_SPECS
    from gradfuse.rerank.base import SIGNALS

    shown = CliRunner().invoke(app, ["methods", "--workspace", str(tmp_path / "ws")], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    for name in (*FUSION_METHODS, *METHOD_SPECS, *SIGNALS):
        assert name in shown.output
    assert "default method: select" in shown.output
