"""Real ``spyglass serve`` subprocesses for the API tests, and clients that talk to them."""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

TINY_ARGS = [
    "--served-model-name",
    "tiny",
    "--kv-cache-memory",
    "64MiB",
    "--max-body-bytes",
    "1MiB",
    "--num-threads",
    "1",
]


@dataclass
class Server:
    """A running server process and where it listens."""

    process: subprocess.Popen
    base_url: str
    log_path: Path

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not exit; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str | None, log_dir: Path, *extra: str, env: dict | None = None) -> Server:
    """Start ``python -m spyglass.core.cli.main serve`` on a free port and wait until /health answers 200."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "spyglass.core.cli.main",
        "serve",
        *([model] if model else []),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]
    log_path = log_dir / f"server-{port}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    server = Server(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    pytest.fail(f"server did not become healthy:\n{server.log()}")


LAYOUTS = ["thread", "process"]
"""The two server layouts (the engine in a thread, in its own process): a fixture's params."""


def start_tiny(layout: str, model_dir: Path, log_dir: Path, *extra: str) -> Server:
    """`start_server` on ``model_dir`` with `TINY_ARGS` and ``extra``, the engine in ``layout``."""
    process = ["--engine-process"] if layout == "process" else []
    return start_server(str(model_dir), log_dir, *TINY_ARGS, *extra, *process)


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_dir, tmp_path_factory):
    """The tiny random Llama behind an open (keyless) server: fast, for protocol tests."""
    server = start_server(str(tiny_llama_dir), tmp_path_factory.mktemp("tiny_server"), *TINY_ARGS)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_compact_server(tiny_llama_dir, tmp_path_factory):
    """The tiny server with compact JSON (``json_whitespace=compact``): the random model's forced
    calls and structures end instead of padding with whitespace."""
    server = start_server(
        str(tiny_llama_dir),
        tmp_path_factory.mktemp("tiny_compact_server"),
        *TINY_ARGS,
        "--plugin-option",
        "json_whitespace=compact",
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_process_server(tiny_llama_dir, tmp_path_factory):
    """The same server with its engine in a process of its own (``--engine-process``)."""
    server = start_server(
        str(tiny_llama_dir),
        tmp_path_factory.mktemp("tiny_process_server"),
        *TINY_ARGS,
        "--engine-process",
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_client(tiny_server) -> openai.OpenAI:
    """The official OpenAI client pointed at the tiny server."""
    return openai.OpenAI(
        base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


@pytest.fixture(scope="module", params=["engine thread", "engine process"])
def layout_server(request, tiny_server, tiny_process_server) -> Server:
    """The tiny server with its engine in a thread, then in a process of its own: a module's
    tests run against both layouts (the process one puts prompts back on outputs itself)."""
    return tiny_server if request.param == "engine thread" else tiny_process_server


@pytest.fixture(scope="module")
def layout_client(layout_server) -> openai.OpenAI:
    """The official OpenAI client pointed at `layout_server`."""
    return openai.OpenAI(
        base_url=f"{layout_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll ``predicate()`` until it returns something truthy; returns it, or fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout} s")


@pytest.fixture
def server_factory(tmp_path):
    """``start(model, *args)`` -> `Server`; every server started this way is stopped after the test."""
    servers = []

    def start(model, *extra, env=None) -> Server:
        server = start_server(model, tmp_path, *extra, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(name="wait_for")
def wait_for_fixture():
    """The `wait_for` polling helper, for test modules (which cannot import conftest)."""
    return wait_for


@pytest.fixture(scope="session")
def real_server(default_model_path, tmp_path_factory):
    """The real default model (SmolLM2-135M-Instruct), started without a MODEL argument."""
    server = start_server(
        None, tmp_path_factory.mktemp("real_server"), "--kv-cache-memory", "256MiB"
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def real_client(real_server) -> openai.OpenAI:
    """The official OpenAI client pointed at the real-model server."""
    return openai.OpenAI(
        base_url=f"{real_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )
