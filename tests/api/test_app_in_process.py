"""The app in-process (Litestar's TestClient): failure paths that a subprocess cannot easily provoke."""

import json

import pytest
from litestar.testing import TestClient

from spyglass.core.api.app import create_app
from spyglass.core.api.context import ServerOptions
from spyglass.core.config import EngineConfig


@pytest.fixture(scope="module")
def client(tiny_llama_dir):
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny", shutdown_timeout=1))) as client:
        yield client


def _break_the_model(client, monkeypatch, after_steps: int = 0):
    runner = client.app.state.serving.async_engine.engine.runner
    execute = runner.execute
    calls = []

    def explode(*args, **kwargs):
        calls.append(1)
        if len(calls) > after_steps:
            raise RuntimeError("simulated device failure")
        return execute(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", explode)


def test_engine_failure_mid_stream_sends_error_event_then_done(client, monkeypatch):
    _break_the_model(client, monkeypatch, after_steps=3)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True, "ignore_eos": True}
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
        assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable"
    finally:
        serving.draining = False
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
