"""Operational endpoints, API keys, back-pressure (429) and graceful SIGTERM shutdown."""

import json
import signal
import threading

import httpx
import openai
import pytest

TINY_ARGS = ["--served-model-name", "tiny", "--kv-cache-memory", "64MiB", "--num-threads", "1"]
LONG = {"prompt": "Go on", "max_tokens": 12000, "stream": True, "ignore_eos": True}


def test_health_version_metrics_schema(tiny_server):
    base = tiny_server.base_url
    assert httpx.get(f"{base}/health").status_code == 200
    # SageMaker's health check, as vLLM serves it: GET or POST.
    assert httpx.get(f"{base}/ping").json() == httpx.post(f"{base}/ping").json() == {"status": "ok"}
    assert httpx.get(f"{base}/version").json()["version"]
    metrics = httpx.get(f"{base}/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert "# TYPE" in metrics.text
    openmetrics = httpx.get(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"})
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")
    schema = httpx.get(f"{base}/schema/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(schema["paths"])


def _stream_until_first_event(
    client: httpx.Client,
    url: str,
    body: dict,
    headers: dict,
    started: threading.Event,
    events: list,
):
    try:
        with client.stream("POST", url, json=body, headers=headers) as response:
            events.append(response.status_code)
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
    except (httpx.TransportError, RuntimeError):
        pass  # the test closes the client to hang up


def test_api_key_and_queue_limit(server_factory, tiny_llama_dir, wait_for):
    server = server_factory(
        str(tiny_llama_dir),
        *TINY_ARGS,
        "--max-num-seqs",
        "1",
        "--max-queued-requests",
        "1",
        "--metrics-require-key",
        env={"SPYGLASS_API_KEY": "sekret"},
    )
    base, auth = server.base_url, {"Authorization": "Bearer sekret"}
    assert httpx.get(f"{base}/health").status_code == 200
    for path in ("/v1/models", "/metrics", "/debug/kv"):
        response = httpx.get(f"{base}{path}")
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        assert (
            httpx.get(f"{base}{path}", headers={"Authorization": "Bearer wrong"}).status_code == 401
        )
        assert httpx.get(f"{base}{path}", headers=auth).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sekret", max_retries=0)
    assert (
        client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens
        >= 1
    )

    # One running (max-num-seqs 1) and one waiting: the queue is full, the next request gets a 429.
    streams = [threading.Event(), threading.Event()]
    outputs: list[list] = [[], []]
    with httpx.Client(timeout=60) as running_client, httpx.Client(timeout=60) as waiting_client:
        threads = [
            threading.Thread(
                target=_stream_until_first_event,
                daemon=True,
                args=(c, f"{base}/v1/completions", LONG, auth, streams[i], outputs[i]),
            )
            for i, c in enumerate((running_client, waiting_client))
        ]
        threads[0].start()
        streams[0].wait(30)
        threads[1].start()
        wait_for(lambda: httpx.get(f"{base}/debug/kv", headers=auth).json()["num_waiting"] == 1)
        wait_for(
            lambda: (
                httpx.post(f"{base}/v1/completions", json={"prompt": "x"}, headers=auth).status_code
                == 429
            )
        )
        response = httpx.post(f"{base}/v1/completions", json={"prompt": "x"}, headers=auth)
        assert response.status_code == 429 and response.headers["retry-after"]
        assert response.json()["error"]["type"] == "rate_limit_error"
        running_client.close()
        waiting_client.close()
    wait_for(lambda: httpx.get(f"{base}/debug/kv", headers=auth).json()["num_requests"] == 0)
    assert (
        httpx.post(
            f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=auth
        ).status_code
        == 200
    )


def test_sigterm_drains_and_exits_zero(server_factory, tiny_llama_dir):
    server = server_factory(str(tiny_llama_dir), *TINY_ARGS, "--shutdown-timeout", "2")
    lines = []
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{server.base_url}/v1/completions", json=LONG) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                if len(lines) == 3:
                    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0, server.log()
    # The in-flight stream was cut short by the drain deadline, yet ended properly.
    assert lines[-1] == "[DONE]"
    last = json.loads(lines[-2])
    assert last["choices"][0]["finish_reason"] in ("abort", "length")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.base_url}/health")
