"""Fixtures for telemetry tests: settings, an in-memory span exporter, a tiny engine, and Phoenix."""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from spyglass.core.config import EngineConfig
from spyglass.core.engine import LLMEngine
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry import tracing

SERVICES = Path(__file__).resolve().parents[1] / "services"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def use_settings():
    """Call with keyword arguments to configure `TelemetrySettings` for the test; restored afterwards."""
    before = telemetry_settings.current()

    def configure(**options):
        telemetry_settings.configure(telemetry_settings.TelemetrySettings(**options))

    yield configure
    telemetry_settings.configure(before)


@pytest.fixture
def span_exporter():
    """Spans finished during the test, in memory (the tracing plugin's provider for the test)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "spyglass-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    yield exporter
    tracing.set_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
def make_engine(tiny_llama_dir):
    """Build an `LLMEngine` on the tiny random Llama (after the test has set its telemetry settings)."""
    engines = []

    def make(**options) -> LLMEngine:
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", **options))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown()


def _run_to_completion(engine: LLMEngine, max_steps: int = 1000) -> dict:
    """Step until no request is left; returns the final `RequestOutput` of each request by id."""
    outputs = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests:
            return outputs
        for output in engine.step():
            outputs[output.request_id] = output
    raise AssertionError("requests did not finish")


@pytest.fixture
def run_to_completion():
    """``run_to_completion(engine) -> {req_id: RequestOutput}``."""
    return _run_to_completion


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    """A Phoenix server on loopback (tests/services/start_phoenix.sh): yields its base URL and OTLP endpoints.

    Set SPYGLASS_SKIP_PHOENIX=1 to skip the tests that need it (the install takes minutes).
    """
    if os.environ.get("SPYGLASS_SKIP_PHOENIX") == "1":
        pytest.skip("SPYGLASS_SKIP_PHOENIX=1: Phoenix end-to-end tests skipped on request")
    http_port, grpc_port = free_port(), free_port()
    env = dict(os.environ, PHOENIX_PORT=str(http_port), PHOENIX_GRPC_PORT=str(grpc_port))
    env.pop("PHOENIX_WORKING_DIR", None)
    log_path = tmp_path_factory.mktemp("phoenix") / "phoenix.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(["bash", str(SERVICES / "start_phoenix.sh")], env=env, stdout=log_file, stderr=log_file)
    base_url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 900  # the first run installs Phoenix
    while True:
        try:
            urllib.request.urlopen(f"{base_url}/healthz", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                output = log_path.read_text(errors="replace")[-4000:]
                pytest.fail(f"Phoenix did not start (exit code {process.poll()}):\n{output}")
            time.sleep(0.5)
    yield {"base_url": base_url, "http_traces": f"{base_url}/v1/traces", "grpc": f"http://127.0.0.1:{grpc_port}"}
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
    log_file.close()
