"""Secrets never reach an output, a log or an error: a malformed PostgreSQL URL with a password (given by the
environment) and an endpoint URL with a password, through every path of a real `gradfuse serve` on loopback and
the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import ASTRONOMY, write_jsonl
from live_server import gradfuse_serve, openai_endpoint

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.redact import redact
from gradfuse.server import API_KEY_ENV

PG_SECRET, GENERATOR_SECRET = "pg-secret-7781", "gen-secret-3342"
MALFORMED_PG_URL = f"postgresql://app:{PG_SECRET}@[::1:5432/kb"  # psycopg cannot parse it


def test_redact_masks_url_passwords_key_values_and_secret_environment_values(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-abcdef")
    text = redact(f"{MALFORMED_PG_URL} host=db password={PG_SECRET} token='t0k3n' key sk-live-abcdef "
                  f"http://user:{GENERATOR_SECRET}@host/v1")
    assert PG_SECRET not in text and GENERATOR_SECRET not in text and "t0k3n" not in text
    assert "sk-live-abcdef" not in text and "postgresql://app:***@[::1:5432/kb" in text
    assert redact("nothing secret at http://host/v1") == "nothing secret at http://host/v1"


@pytest.mark.slow
def test_no_secret_reaches_any_response_event_or_log(tmp_path):
    from gradfuse.generate import make_generator

    ws_root = tmp_path / "ws"
    Workspace(Config(workspace=ws_root)).index(
        SourceSpec("astronomy", "jsonl", str(write_jsonl(tmp_path / "a.jsonl", ASTRONOMY))))
    log = tmp_path / "server.log"
    seen = []
    with openai_endpoint(make_generator("smollm2")) as endpoint:
        generator = endpoint.replace("http://", f"http://app:{GENERATOR_SECRET}@")
        config = tmp_path / "gradfuse.toml"
        config.write_text(f'workspace = "{ws_root}"\n[generator]\nmodel = "{generator}"\n'
                          '[sources.tickets]\nkind = "postgres"\nurl_env = "TICKETS_URL"\ntable = "tickets"\n')
        env = {API_KEY_ENV: "", "TICKETS_URL": MALFORMED_PG_URL}
        with gradfuse_serve(ws_root, "--config", str(config), env=env, log=log) as url:
            def post(path, body):
                answer = httpx.post(url + path, json=body, timeout=120)
                seen.append(answer.text)
                return answer

            sources = httpx.get(url + "/sources", timeout=30)
            seen.append(sources.text)
            assert {s["name"]: s["status"] for s in sources.json()} == {"astronomy": "ok", "tickets": "error"}
            mixed = post("/search", {"query": "moons of Mars", "method": "rrf"})
            assert mixed.status_code == 200 and mixed.json()["failures"][0]["source"] == "tickets"
            assert post("/search", {"query": "moons", "method": "rrf", "sources": ["tickets"]}).status_code == 503
            asked = post("/ask", {"query": "Which planet has two moons?", "method": "rrf", "k": 2,
                                  "max_new_tokens": 12})
            assert asked.status_code == 200 and asked.json()["generator"] == redact(generator)
            with httpx.stream("POST", url + "/ask", json={"query": "moons", "method": "rrf", "k": 1, "stream": True,
                                                          "max_new_tokens": 8}, timeout=120) as streamed:
                text = streamed.read().decode()
                seen.append(text)
                assert "event: answer" in text
            seen.append(httpx.get(url + "/sources", timeout=30).text)  # with the last failures it saw
    # The endpoint is gone now: the errors name it, without its password.
    with gradfuse_serve(ws_root, "--config", str(config), env=env, log=tmp_path / "server2.log") as url:
        failed = httpx.post(url + "/ask", json={"query": "moons", "method": "rrf", "k": 1}, timeout=120)
        seen.append(failed.text)
        assert failed.status_code == 502 and "unreachable" in failed.json()["detail"]
        with httpx.stream("POST", url + "/ask", json={"query": "moons", "method": "rrf", "k": 1, "stream": True},
                          timeout=120) as streamed:
            text = streamed.read().decode()
            seen.append(text)
            assert "event: error" in text
    seen += [log.read_text(), (tmp_path / "server2.log").read_text()]
    cli = subprocess.run([str(Path(sys.executable).with_name("gradfuse")), "search", "moons", "--config", str(config),
                          "--source", "tickets", "--method", "rrf"], capture_output=True, text=True,
                         env={**os.environ, **env})
    assert cli.returncode != 0
    seen += [cli.stdout, cli.stderr]
    everything = "\n".join(seen)
    assert "tickets" in everything and "unreachable" in everything  # the failures are there, named
    assert PG_SECRET not in everything and GENERATOR_SECRET not in everything
