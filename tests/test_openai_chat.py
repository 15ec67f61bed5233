"""OpenAI's chat completions on a live `gradfuse serve`, asked through the official `openai` SDK: answers plain and
streamed with their citations and evidence read back from the extension fields, a wrong key, requests over the
limits, a follow-up that needs the turn before it, a client that leaves mid-stream, and an OpenAI-compatible
generator behind gradfuse."""

from __future__ import annotations

import httpx
import pytest

from conftest import ASTRONOMY, COOKING, write_jsonl
from live_server import gradfuse_serve, openai_endpoint

from gradfuse import SourceSpec, Workspace
from gradfuse.config import Config
from gradfuse.server import API_KEY_ENV

openai = pytest.importorskip("openai")
KEY = "chat-key-for-tests"
QUESTION = "Which planet has the moons Phobos and Deimos?"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    ws = Workspace(Config(workspace=root / "ws"))
    ws.index(SourceSpec("astronomy", "jsonl", str(write_jsonl(root / "a.jsonl", ASTRONOMY))))
    ws.index(SourceSpec("cooking", "jsonl", str(write_jsonl(root / "c.jsonl", COOKING))))
    with gradfuse_serve(root / "ws", env={API_KEY_ENV: KEY}) as url:
        yield url, root


def _client(url: str, key: str = KEY):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def test_models_are_the_methods_and_an_answer_carries_its_citations_and_evidence(served):
    url, _ = served
    client = _client(url)
    models = {m.id: m for m in client.models.list()}
    assert {"gradfuse", "gradfuse-rrf", "gradfuse-select", "gradfuse-gro"} <= set(models)
    assert "scoring-LM" in models["gradfuse-gro"].model_extra["gradfuse"]["cost"]
    reply = client.chat.completions.create(model="gradfuse-select", messages=[{"role": "user", "content": QUESTION}])
    message = reply.choices[0].message
    assert reply.object == "chat.completion" and reply.choices[0].finish_reason == "stop"
    assert "Phobos" in message.content and "[1]" in message.content
    citations, evidence = message.model_extra["citations"], message.model_extra["evidence"]
    first = citations[0]
    assert first["number"] == 1 and (first["source"], first["doc_id"]) in {("astronomy", "mars"),
                                                                           ("cooking", "mars-copy")}
    assert first["quotes"] and "Phobos" in first["quotes"][0]["text"]
    start, end = evidence[0]["span"]
    assert end > start and evidence[0]["passage"] == 1
    extension = reply.model_extra["gradfuse"]
    assert extension["method"] == "select" and extension["failures"] == [] and extension["abstained"] is False


def test_a_streamed_answer_is_the_same_answer_with_its_citations_in_the_last_chunk(served):
    url, _ = served
    client = _client(url)
    asked = [{"role": "user", "content": QUESTION}]
    plain = client.chat.completions.create(model="gradfuse-select", messages=asked).choices[0].message
    chunks = list(client.chat.completions.create(model="gradfuse-select", messages=asked, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.content
    last = chunks[-1].choices[0]
    assert last.finish_reason == "stop" and all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert last.delta.model_extra["citations"] == plain.model_extra["citations"]  # sent once, at the end
    assert last.delta.model_extra["evidence"] == plain.model_extra["evidence"]


def test_a_follow_up_is_asked_with_the_turn_before_it(served):
    url, _ = served
    conversation = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Tell me about Venus."},
                    {"role": "assistant", "content": "Venus is the second planet [1]."},
                    {"role": "user", "content": [{"type": "text", "text": "What is its atmosphere made of?"}]}]
    reply = _client(url).chat.completions.create(model="gradfuse-select", messages=conversation,
                                                 temperature=0.2, top_p=0.9, user="someone", seed=3)
    assert reply.model_extra["gradfuse"]["question"] == "Tell me about Venus.\nWhat is its atmosphere made of?"
    cited = reply.choices[0].message.model_extra["citations"]
    assert cited and cited[0]["doc_id"] == "venus" and "carbon dioxide" in reply.choices[0].message.content


def test_wrong_key_and_requests_over_the_limits_are_refused_in_openais_shape(served):
    url, _ = served
    with pytest.raises(openai.AuthenticationError) as refused:
        _client(url, "not-the-key").chat.completions.create(model="gradfuse", messages=[{"role": "user",
                                                                                          "content": "hi"}])
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    client = _client(url)
    with pytest.raises(openai.BadRequestError, match="characters; this server accepts at most"):
        client.chat.completions.create(model="gradfuse", messages=[{"role": "user", "content": "moons " * 2000}])
    with pytest.raises(openai.BadRequestError, match="max_tokens = 100000 is above"):  # its name, not /ask's
        client.chat.completions.create(model="gradfuse", messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=100000)
    with pytest.raises(openai.BadRequestError, match="n"):
        client.chat.completions.create(model="gradfuse", messages=[{"role": "user", "content": QUESTION}], n=2)
    with pytest.raises(openai.BadRequestError, match="no user message"):
        client.chat.completions.create(model="gradfuse", messages=[{"role": "system", "content": "be brief"}])
    surrogate = httpx.post(f"{url}/v1/chat/completions", timeout=30, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},  # the SDK cannot encode a lone surrogate
        content=b'{"model": "gradfuse", "messages": [{"role": "user", "content": "moons \\ud800"}]}')
    message = surrogate.json()["error"]["message"]
    assert surrogate.status_code == 400 and message == \
        "the question from messages: not valid Unicode text (a lone surrogate escape such as \\ud800)"
    assert not any(word in message for word in ("pydantic", "type=", "input_value", "validation error for"))
    with pytest.raises(openai.NotFoundError, match="does not exist") as missing:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": QUESTION}])
    assert missing.value.code == "model_not_found"
    other = httpx.get(f"{url}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert other.status_code == 404 and other.json()["error"]["code"] is None  # not a model: no such path
    huge = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      content=b"{" + b" " * 2_000_000 + b"}", timeout=30)
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
    assert httpx.post(f"{url}/search", json={"query": "moons"}, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=30).status_code == 200  # the bearer form of the key works on every path


@pytest.mark.slow
def test_a_client_that_leaves_mid_stream_gives_its_place_in_the_lm_line_back(served):
    _, root = served
    config = root / "line.toml"
    config.write_text(f'workspace = "{root / "ws"}"\n[generator]\nanswer = "generate"\n[server]\nlm_queue = 1\n')
    with gradfuse_serve(root / "ws", "--config", str(config), env={API_KEY_ENV: ""}) as url:
        client = _client(url, "unused")
        asked = [{"role": "user", "content": QUESTION}]
        for _ in range(3):  # the line holds one: each client leaves after the first chunk, and the next gets in
            stream = _admitted(lambda: client.chat.completions.create(model="gradfuse-rrf", stream=True,
                                                                      max_tokens=64, messages=asked))
            next(iter(stream))
            stream.close()
        reply = _admitted(lambda: client.chat.completions.create(model="gradfuse-rrf", max_tokens=4, messages=asked))
        assert reply.choices[0].message.content


def _admitted(request, within_s: float = 60.0):
    """`request` once the LM line has room: 503 while an abandoned answer stops at its next piece, never after."""
    import time

    deadline = time.monotonic() + within_s
    while True:
        try:
            return request()
        except openai.APIStatusError as error:
            assert error.status_code == 503 and time.monotonic() < deadline, "the LM line stayed full"
            time.sleep(0.5)


@pytest.mark.slow
def test_an_openai_compatible_generator_behind_gradfuse_answers_through_the_sdk(served):
    from gradfuse.generate import make_generator

    _, root = served
    with openai_endpoint(make_generator("smollm2")) as (endpoint, _):
        config = root / "endpoint.toml"
        config.write_text(f'workspace = "{root / "ws"}"\n[generator]\nmodel = "{endpoint}"\n')
        with gradfuse_serve(root / "ws", "--config", str(config), env={API_KEY_ENV: ""}) as url:
            reply = _client(url, "unused").chat.completions.create(
                model="gradfuse-rrf", max_tokens=30, messages=[{"role": "user", "content": QUESTION}])
    message = reply.choices[0].message
    assert message.content and reply.model_extra["gradfuse"]["generator_note"]
    assert all(c["source"] in ("astronomy", "cooking") for c in message.model_extra["citations"])
