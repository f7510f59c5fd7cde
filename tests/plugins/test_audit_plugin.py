"""The example third-party plugin (examples/plugins/spyglass-audit), pip-installed, used by engine and server."""

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from spyglass.core.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module", autouse=True)
def audit_installed():
    names = {ep.name for ep in importlib.metadata.entry_points(group="spyglass")}
    if "audit" not in names:
        message = "pip install -e examples/plugins/spyglass-audit (tests/run.sh does)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)


def read_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_engine_writes_one_audit_line_per_finished_request(
    make_engine, driver, tmp_path, monkeypatch
):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("SPYGLASS_AUDIT_LOG", str(log))
    engine = make_engine(plugins=["fcfs", "prefix_cache", "audit"])
    secret = "the quarterly numbers are bad"
    done = engine.add_request("done", [5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                              prompt=secret, attributes={"tenant": "acme"})  # fmt: skip
    driver.add(engine, [5, 6, 7], SamplingParams(max_tokens=50))
    engine.step()
    aborted = driver.add(engine, [1, 2, 3], SamplingParams(max_tokens=50))
    engine.abort(aborted.req_id)
    driver.drain(engine)
    engine.shutdown()
    lines = {line["req_id"]: line for line in read_lines(log)}
    assert len(lines) == 3
    assert lines["done"]["reason"] == "length" and lines["done"]["output_tokens"] == 3
    assert lines["done"]["prompt_tokens"] == 5 and lines["done"]["tenant"] == "acme"
    assert lines["done"]["ttft_s"] > 0 and lines["done"]["e2e_s"] >= lines["done"]["ttft_s"]
    assert lines[aborted.req_id]["reason"] == "abort" and lines[aborted.req_id]["ttft_s"] is None
    assert secret not in log.read_text() and done.prompt == secret


def test_audit_is_silent_without_its_variable(make_engine, driver, monkeypatch):
    monkeypatch.delenv("SPYGLASS_AUDIT_LOG", raising=False)
    engine = make_engine(plugins=["fcfs", "audit"])
    driver.add(engine, [5, 6, 7])
    driver.drain(engine)
    assert not any(engine.hooks.num_errors.values())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_real_server_loads_the_plugin_and_takes_priority_tenant_and_deadline(
    tiny_llama_dir, tmp_path
):
    log, port = tmp_path / "audit.jsonl", _free_port()
    command = [sys.executable, "-m", "spyglass.core.cli.main", "serve", str(tiny_llama_dir), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "tiny", "--kv-cache-memory", "64MiB",
               "--num-threads", "1", "--policy", "slo", "--disable-plugins", "tracing"]  # fmt: skip
    server_log = tmp_path / "server.log"
    with server_log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "SPYGLASS_AUDIT_LOG": str(log)})  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, server_log.read_text()
            assert time.monotonic() < deadline, server_log.read_text()
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"model": "tiny", "prompt": "Spyglass audit test " * 4, "max_tokens": 3, "temperature": 0,
                "priority": 3, "ttft_slo_s": 5.0}  # fmt: skip
        responses = [
            httpx.post(
                f"{base}/v1/completions",
                json=body,
                headers={"X-Spyglass-Tenant": "acme"},
                timeout=60,
            )
            for _ in range(2)
        ]
        assert [r.status_code for r in responses] == [200, 200], responses[0].text
        usage = responses[1].json()["usage"]
        assert (
            usage["prompt_tokens_details"]["cached_tokens"] > 0
        )  # the prefix cache is on by default
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    lines = read_lines(log)
    assert len(lines) == 2
    assert all(
        line["priority"] == 3 and line["tenant"] == "acme" and line["reason"] == "length"
        for line in lines
    )
    assert lines[1]["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
