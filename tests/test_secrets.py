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

PG_SECRET, GENERATOR_SECRET, PERCENT_SECRET = "pg-secret-7781", "it's-gen-secret-3342", "pc%zz-SECRET-5150"
MALFORMED_PG_URL = f"postgresql://app:{PG_SECRET}@[::1:5432/kb"  # psycopg cannot parse it
PERCENT_PG_URL = f"postgresql://app:{PERCENT_SECRET}@127.0.0.1:9/kb"  # libpq quotes the bad %-token back


def test_redact_masks_url_userinfo_key_values_and_secret_environment_values(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-abcdef")
    text = redact(f"{MALFORMED_PG_URL} host=db password={PG_SECRET} token='t0k3n' key sk-live-abcdef "
                  f"http://user:{GENERATOR_SECRET}@host/v1 http://bob:it is \"q\" SECRET-1@host/ "
                  '{"password": "json-SECRET-2", "api_key":"json-SECRET-3"} password=it\'s-SECRET-4 ')
    for secret in (PG_SECRET, GENERATOR_SECRET, "t0k3n", "sk-live-abcdef", "SECRET-1", "SECRET-2", "SECRET-3",
                   "SECRET-4", "s-SECRET"):
        assert secret not in text, (secret, text)
    assert "postgresql://***@[::1:5432/kb" in text and "host/v1" in text
    assert redact("nothing secret at http://host/v1") == "nothing secret at http://host/v1"
    assert redact("k = 1234 is too large", environment=False) == "k = 1234 is too large"


def test_libpq_errors_are_shown_without_the_pieces_of_the_url_they_quote():
    import psycopg

    from gradfuse.redact import driver_message

    with pytest.raises(psycopg.Error) as raised:
        psycopg.connect(PERCENT_PG_URL, connect_timeout=2)
    assert "SECRET-5150" in str(raised.value)  # what libpq itself says
    shown = driver_message(raised.value)
    assert "SECRET-5150" not in shown and "percent-encoded" in shown


def test_a_guessed_secret_is_answered_like_any_other_guess(workspace, monkeypatch):
    """A value-based mask on an echoed input is an equality oracle: the error must not depend on the guess."""
    from live_server import serving

    from gradfuse.server import create_app

    secret = "guessable-Secret-99"
    monkeypatch.setenv("PGPASSWORD", secret)
    with serving(create_app(workspace)) as url:
        def detail(body):
            answer = httpx.post(url + "/search", json={"query": "moons", **body}, timeout=60)
            assert answer.status_code == 422, answer.text
            return answer.text

        for field in ("method", "sources"):
            def body(guess):
                return {"method": f"single:{guess}"} if field == "method" else {"sources": [guess]}

            right, wrong = detail(body(secret)), detail(body("guessable-Wrong-11"))
            assert right == wrong and "***" not in right, (right, wrong)
        assert detail({"k": 10**400}) == detail({"k": 10**401})  # a huge number is a 422, not a 500


@pytest.mark.slow
def test_no_secret_reaches_any_response_event_or_log(tmp_path):
    from gradfuse.generate import make_generator

    ws_root = tmp_path / "ws"
    Workspace(Config(workspace=ws_root)).index(
        SourceSpec("astronomy", "jsonl", str(write_jsonl(tmp_path / "a.jsonl", ASTRONOMY))))
    log = tmp_path / "server.log"
    seen = []
    with openai_endpoint(make_generator("smollm2")) as (endpoint, _):
        generator = endpoint.replace("http://", f"http://app:{GENERATOR_SECRET}@")
        config = tmp_path / "gradfuse.toml"
        config.write_text(f'workspace = "{ws_root}"\n[generator]\nmodel = "{generator}"\n'
                          '[sources.tickets]\nkind = "postgres"\nurl_env = "TICKETS_URL"\ntable = "tickets"\n'
                          '[sources.wiki]\nkind = "postgres"\nurl_env = "WIKI_URL"\ntable = "wiki"\n')
        env = {API_KEY_ENV: "", "TICKETS_URL": MALFORMED_PG_URL, "WIKI_URL": PERCENT_PG_URL}
        with gradfuse_serve(ws_root, "--config", str(config), env=env, log=log) as url:
            def post(path, body):
                answer = httpx.post(url + path, json=body, timeout=120)
                seen.append(answer.text)
                return answer

            sources = httpx.get(url + "/sources", timeout=30)
            seen.append(sources.text)
            assert {s["name"]: s["status"] for s in sources.json()} == {"astronomy": "ok", "tickets": "error",
                                                                         "wiki": "error"}
            mixed = post("/search", {"query": "moons of Mars", "method": "rrf"})
            assert mixed.status_code == 200
            assert {f["source"] for f in mixed.json()["failures"]} == {"tickets", "wiki"}
            for failing in ("tickets", "wiki"):
                assert post("/search", {"query": "moons", "method": "rrf", "sources": [failing]}).status_code == 503
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
    for failing in ("tickets", "wiki"):
        cli = subprocess.run([str(Path(sys.executable).with_name("gradfuse")), "search", "moons", "--config",
                              str(config), "--source", failing, "--method", "rrf"], capture_output=True, text=True,
                             env={**os.environ, **env})
        assert cli.returncode != 0
        seen += [cli.stdout, cli.stderr]
    cli = subprocess.run([str(Path(sys.executable).with_name("gradfuse")), "ask", "moons", "--config", str(config),
                          "--source", "astronomy", "--method", "rrf", "-k", "1"], capture_output=True, text=True,
                         env={**os.environ, **env})
    assert cli.returncode == 2 and "unreachable" in cli.stdout + cli.stderr, cli.stdout + cli.stderr
    assert "Traceback" not in cli.stdout + cli.stderr  # an unreachable endpoint is one line, not a traceback
    seen += [cli.stdout, cli.stderr]
    everything = "\n".join(seen)
    assert "tickets" in everything and "wiki" in everything and "unreachable" in everything  # named failures
    assert "percent-encoded" in everything
    for secret in (PG_SECRET, GENERATOR_SECRET, PERCENT_SECRET, "SECRET-5150", "gen-secret-3342"):
        assert secret not in everything, secret
