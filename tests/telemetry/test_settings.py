"""Telemetry settings, CLI options, and tracer provider set-up from options and OTEL_* variables."""

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

from spyglass.telemetry import tracing
from spyglass.telemetry.cli_options import add_telemetry_arguments, settings_from_args
from spyglass.telemetry.settings import TelemetrySettings

OTEL_VARS = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "PHOENIX_PROJECT_NAME",
    "OTEL_SDK_DISABLED",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


def parse(*argv: str) -> TelemetrySettings:
    parser = argparse.ArgumentParser()
    add_telemetry_arguments(parser)
    return settings_from_args(parser.parse_args(list(argv)))


def test_cli_options():
    assert parse() == TelemetrySettings()
    assert (parse("--telemetry", "off").metrics, parse("--telemetry", "off").tracing) == (
        False,
        False,
    )
    assert (parse("--telemetry", "metrics").metrics, parse("--telemetry", "metrics").tracing) == (
        True,
        False,
    )
    s = parse(
        "--otlp-traces-endpoint",
        "http://x:4317",
        "--trace-content",
        "--trace-steps",
        "--log-content",
        "--slo-ttft",
        "0.2",
        "--slo-tpot",
        "0.02",
        "--otlp-protocol",
        "grpc",
    )
    assert s == TelemetrySettings(True, True, True, True, "http://x:4317", "grpc", 0.2, 0.02, True)
    with pytest.raises(ValueError):
        TelemetrySettings(otlp_protocol="udp")
    with pytest.raises(ValueError):
        TelemetrySettings(slo_ttft_s=0)
    vllm = parse("--metrics-namespace", "vllm", "--trace-steps-interval", "2.5")
    assert (vllm.metrics_namespace, vllm.trace_steps_interval_s) == ("vllm", 2.5)
    with pytest.raises(ValueError):
        TelemetrySettings(metrics_namespace="sglang")
    with pytest.raises(ValueError):
        TelemetrySettings(trace_steps_interval_s=0)


def test_served_model_name_comes_from_the_serve_option():
    parser = argparse.ArgumentParser()
    parser.add_argument("--served-model-name")
    add_telemetry_arguments(parser)
    assert (
        settings_from_args(parser.parse_args(["--served-model-name", "tiny"])).served_model_name
        == "tiny"
    )


def test_no_provider_without_an_endpoint_or_with_tracing_off(monkeypatch):
    assert tracing.build_tracer_provider(TelemetrySettings()) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing.build_tracer_provider(TelemetrySettings(tracing=False)) is None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.build_tracer_provider(TelemetrySettings()) is None


def _exporter(provider):
    (processor,) = provider._active_span_processor._span_processors
    return processor._batch_processor._exporter


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_otlp_http_wire_follows_the_environment(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}/api/public/otel"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Basic cGs6c2s=")
    provider = tracing.build_tracer_provider(TelemetrySettings())
    provider.get_tracer("t").start_span("hello").end()
    assert provider.force_flush(10_000)
    provider.shutdown()
    server.shutdown()
    (path, headers, body), *_ = _Receiver.received
    assert path == "/api/public/otel/v1/traces"  # Langfuse's endpoint shape
    assert (
        headers["Authorization"] == "Basic cGs6c2s="
        and headers["Content-Type"] == "application/x-protobuf"
    )
    assert b"hello" in body and b"openinference.project.name" in body


def test_exporter_from_option_and_environment(monkeypatch):
    provider = tracing.build_tracer_provider(
        TelemetrySettings(otlp_traces_endpoint="http://127.0.0.1:6006")
    )
    exporter = _exporter(provider)
    assert (
        isinstance(exporter, HttpExporter)
        and exporter._endpoint == "http://127.0.0.1:6006/v1/traces"
    )
    assert isinstance(
        _exporter(
            tracing.build_tracer_provider(TelemetrySettings(otlp_traces_endpoint="http://h:4317"))
        ),
        GrpcExporter,
    )

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://cloud.langfuse.com/api/public/otel")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-llm")
    provider = tracing.build_tracer_provider(TelemetrySettings())
    assert isinstance(_exporter(provider), HttpExporter)
    assert "0.25" in provider.sampler.get_description()
    assert provider.resource.attributes["service.name"] == "my-llm"
    assert provider.resource.attributes["openinference.project.name"] == "my-llm"

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("PHOENIX_PROJECT_NAME", "evals")
    provider = tracing.build_tracer_provider(TelemetrySettings())
    assert isinstance(_exporter(provider), GrpcExporter)
    assert provider.resource.attributes["openinference.project.name"] == "evals"


def test_default_resource_and_clock_conversion():
    resource = tracing.build_resource()
    assert resource.attributes["service.name"] == "spyglass"
    assert resource.attributes["openinference.project.name"] == "spyglass"
    assert abs(tracing.monotonic_to_epoch_ns(time.monotonic()) - time.time_ns()) < 50_000_000
    assert abs(tracing.perf_counter_to_epoch_ns(time.perf_counter()) - time.time_ns()) < 50_000_000


def test_telemetry_plugins_come_through_entry_points():
    from spyglass.core.engine.plugin_manager import create_plugin_manager, describe_plugins

    hooks = dict(describe_plugins(create_plugin_manager()))
    assert {"spyglass_request_finished", "spyglass_step_finished"} <= set(hooks["metrics"])
    assert {"spyglass_request_added", "spyglass_step_started", "spyglass_request_preempted"} <= set(
        hooks["tracing"]
    )
    assert "spyglass_request_finished" in hooks["request_log"]
