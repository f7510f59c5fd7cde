"""Fixtures for telemetry tests: settings, an in-memory span exporter, a tiny engine, and Phoenix."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
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


def _require_tool(name: str) -> None:
    if shutil.which(name) is None:
        message = f"{name} is not installed (apt-get install prometheus / nodejs npm)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def require_tool():
    """``require_tool(name)``: skip without the tool on a developer machine; in CI (CI set) fail instead."""
    return _require_tool


@dataclass
class Prometheus:
    """A running Prometheus: its HTTP API, and a wait for scrapes."""

    base_url: str

    def api(self, path: str, **params) -> dict:
        """GET ``path`` with ``params``; the JSON answer, errors included."""
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            return json.load(error)

    def wait_for_scrapes(self, count: int, timeout: float = 60) -> None:
        """Return once the target has been scraped ``count`` times (within the last minute)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.api("/api/v1/query", query="count_over_time(up[1m])")["data"]["result"]
            if result and float(result[0]["value"][1]) >= count:
                return
            time.sleep(0.3)
        raise AssertionError(f"Prometheus did not scrape {count} times")


def _ready(base_url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{base_url}/-/ready", timeout=1).status == 200
    except OSError:
        return False


@pytest.fixture
def start_prometheus(tmp_path, require_tool):
    """``start_prometheus("host:port")`` -> `Prometheus` scraping that target every second (job spyglass).

    Exemplar storage is on; every Prometheus started is stopped after the test.
    """
    require_tool("prometheus")
    processes = []

    def start(target: str) -> Prometheus:
        index = len(processes)
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "spyglass", "static_configs": [{"targets": [target]}]}],
        }
        config_path = tmp_path / f"prometheus-{index}.yml"
        config_path.write_text(yaml.safe_dump(config))
        log_path = tmp_path / f"prometheus-{index}.log"
        port = free_port()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config_path}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    f"--storage.tsdb.path={tmp_path / f'data-{index}'}",
                    "--enable-feature=exemplar-storage",
                ],
                stdout=log,
                stderr=log,
            )
        processes.append(process)
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not _ready(base_url):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        return Prometheus(base_url)

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=20)


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
