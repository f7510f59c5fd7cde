"""The app in-process (Litestar's TestClient): failure paths that a subprocess cannot easily provoke."""

import json
import threading

import pytest
from litestar.testing import TestClient

from spyglass.core.api.app import create_app
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig


@pytest.fixture(scope="module")
def client(tiny_llama_dir):
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    with TestClient(
        create_app(config, ServerOptions(served_model_name="tiny", shutdown_timeout=1))
    ) as client:
        yield client


def _engine_of(client):
    """The `LLMEngine` behind the app, fetched through the loop thread (the API itself sees only snapshots)."""
    return client.app.state.serving.async_engine.call(lambda engine: engine).result(30)


def _break_the_model(client, monkeypatch, after_steps: int = 0):
    runner = _engine_of(client).runner
    launch = runner.launch  # where every step, and every rerun of a failed one, starts
    calls = []

    def explode(*args, **kwargs):
        calls.append(1)
        if len(calls) > after_steps:
            raise RuntimeError("simulated device failure")
        return launch(*args, **kwargs)

    monkeypatch.setattr(runner, "launch", explode)


def test_engine_failure_mid_stream_sends_error_event_then_done(client, monkeypatch):
    _break_the_model(client, monkeypatch, after_steps=3)
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "stream": True,
        "ignore_eos": True,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "engine_error"
    assert any(json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:-2])
    # Non-streamed: an OpenAI-shaped 500, not a truncated answer.
    monkeypatch.undo()
    _break_the_model(client, monkeypatch)
    response = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert response.status_code == 500 and response.json()["error"]["type"] == "internal_error"
    monkeypatch.undo()
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200


def test_draining_server_refuses_work_with_503(client):
    serving = client.app.state.serving
    serving.draining = True
    try:
        assert client.get("/ready").status_code == 503
        health = client.get("/health")  # liveness: the process is fine while it drains
        assert health.status_code == 200 and health.json()["status"] == "draining"
        response = client.post("/v1/completions", json={"prompt": "hi"})
        assert (
            response.status_code == 503
            and response.json()["error"]["type"] == "service_unavailable"
        )
    finally:
        serving.draining = False
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200


def test_a_command_whose_caller_gave_up_does_not_kill_the_loop(client):
    # What `GET /debug/kv` did during a long prefill: time out, cancel its future, and later the
    # loop ran the command and crashed setting a result on the cancelled future.
    async_engine = client.app.state.serving.async_engine
    gate = threading.Event()
    busy = async_engine.call(lambda engine: gate.wait(30))  # holds the loop between steps
    abandoned = async_engine.call(lambda engine: engine.kv.pool.num_blocks)
    assert abandoned.cancel()
    gate.set()
    assert busy.result(30) is True
    assert async_engine.call(lambda engine: "still here").result(30) == "still here"
    assert client.get("/health").status_code == 200
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_too_long_text_is_refused_before_tokenizing(client):
    serving = client.app.state.serving
    response = client.post("/v1/completions", json={"prompt": "a" * (serving.max_prompt_bytes + 1)})
    assert response.status_code == 400
    assert (
        response.json()["error"]["param"] == "prompt"
        and "too long" in response.json()["error"]["message"]
    )


def test_a_crashed_engine_loop_is_reported_for_the_process_to_exit(
    tiny_llama_dir, monkeypatch, wait_for
):
    crashes = []
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    app = create_app(config, ServerOptions(shutdown_timeout=1), on_engine_crash=crashes.append)
    with TestClient(app) as client:
        engine = _engine_of(client)
        monkeypatch.setattr(
            engine, "step", lambda: 1 / 0
        )  # a bug in the loop itself, not in one request
        response = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert (
            response.status_code == 503 and response.json()["error"]["code"] == "engine_unavailable"
        )
        assert [type(error) for error in crashes] == [ZeroDivisionError]
        wait_for(lambda: client.get("/health").status_code == 503)


def test_cors_is_off_unless_origins_are_allowed(client, tiny_llama_dir):
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    assert (
        "access-control-allow-origin"
        not in client.options("/v1/completions", headers=preflight).headers
    )
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    options = ServerOptions(allowed_origins=["https://app.example"], shutdown_timeout=1)
    with TestClient(create_app(config, options)) as cors_client:
        allowed = {**preflight, "Origin": "https://app.example"}
        response = cors_client.options("/v1/completions", headers=allowed)
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        refused = cors_client.options("/v1/completions", headers=preflight)
        assert "access-control-allow-origin" not in refused.headers


def test_a_non_streamed_call_gets_its_first_and_final_outputs_only(client, monkeypatch):
    """Its engine request sends the first token's output (the call has started) and the final one;
    none between. A streamed call gets one per token, and the same text."""
    processor = _engine_of(client).outputs
    output = processor.output
    sent = []

    def kept(request):
        result = output(request)
        if result is not None:
            sent.append(len(result.outputs[0].token_ids))
        return result

    monkeypatch.setattr(processor, "output", kept)
    body = {"prompt": "hi", "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    whole = client.post("/v1/completions", json=body).json()
    assert sent == [1, 11] and whole["usage"]["completion_tokens"] == 12
    sent.clear()
    streamed = client.post("/v1/completions", json={**body, "stream": True})
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert sent == [1] * 12 and text == whole["choices"][0]["text"]
