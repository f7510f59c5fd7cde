"""Fixtures for telemetry tests: settings, an in-memory span exporter, a tiny engine.

Prometheus and Phoenix, which the API tests use too, are in tests/conftest.py.
"""

import io
import logging

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry import tracing
from spyglass.telemetry.logging import setup_logging


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


@pytest.fixture(scope="session")
def tiny_lora_dirs(tiny_llama_dir, make_lora_adapter) -> dict[str, str]:
    """Two PEFT LoRA adapters for the tiny Llama by name, as `EngineConfig.lora_modules` takes them."""
    return {
        name: str(make_lora_adapter(tiny_llama_dir, ("q_proj", "v_proj"), seed=seed))
        for seed, name in enumerate(("tiny-lora-a", "tiny-lora-b"))
    }


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


@pytest.fixture
def log_stream():
    """Route every log record through `setup_logging` into a buffer (JSON lines); restore logging afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    setup_logging(logging.INFO, json=True, stream=stream)
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)
