"""Tracer set-up: a TracerProvider built from the standard ``OTEL_*`` variables and Spyglass's options.

Traces are exported over OTLP (gRPC or HTTP/protobuf) to Phoenix, Langfuse, Tempo, Jaeger or a
collector. With no endpoint configured and no SDK provider installed by the embedding program,
there is no provider: the tracing plugin then stays idle and costs nothing.

Request times are ``time.monotonic()`` and step times ``time.perf_counter()``; spans need epoch
nanoseconds, so both clocks are mapped through offsets captured once at import, which keeps
every span of a trace consistent with the others.
"""

import os
import threading
import time
import weakref
from urllib.parse import urlparse

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanContext

from spyglass.telemetry import settings as telemetry_settings

TRACER_NAME = "spyglass"
PROJECT_ATTRIBUTE = "openinference.project.name"

_MONOTONIC_OFFSET_NS = time.time_ns() - time.monotonic_ns()
_PERF_OFFSET_NS = time.time_ns() - time.perf_counter_ns()

_lock = threading.Lock()
_provider: TracerProvider | None = None
_resolved = False
_request_spans: "weakref.WeakKeyDictionary[object, SpanContext]" = weakref.WeakKeyDictionary()


def monotonic_to_epoch_ns(seconds: float) -> int:
    """A ``time.monotonic()`` reading as epoch nanoseconds (what span timestamps are)."""
    return int(seconds * 1e9) + _MONOTONIC_OFFSET_NS


def perf_counter_to_epoch_ns(seconds: float) -> int:
    """A ``time.perf_counter()`` reading as epoch nanoseconds."""
    return int(seconds * 1e9) + _PERF_OFFSET_NS


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def resolve_protocol(endpoint: str | None, protocol: str | None) -> str:
    """The OTLP protocol: explicit, else ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``, else guessed from the port."""
    protocol = protocol or _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol:
        return protocol
    if endpoint and urlparse(endpoint).port == 4317:
        return "grpc"
    return "http/protobuf"


def build_exporter(endpoint: str | None, protocol: str | None) -> SpanExporter:
    """An OTLP span exporter; ``endpoint`` None leaves it to the ``OTEL_EXPORTER_OTLP_*`` variables.

    For HTTP an endpoint without a path gets ``/v1/traces`` appended, as for
    ``OTEL_EXPORTER_OTLP_ENDPOINT``. Headers, certificates and timeouts come from the
    environment, where the exporters read them themselves.
    """
    if resolve_protocol(endpoint, protocol) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint) if endpoint else GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint and urlparse(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint) if endpoint else HttpExporter()


def build_resource() -> Resource:
    """``service.name`` (``OTEL_SERVICE_NAME``, default spyglass) and the Phoenix project name.

    ``OTEL_RESOURCE_ATTRIBUTES`` can set both; ``PHOENIX_PROJECT_NAME`` also names the project.
    """
    detected = Resource.create({})
    service = detected.attributes.get("service.name", "")
    if not service or str(service).startswith("unknown_service"):
        service = "spyglass"
    project = (
        detected.attributes.get(PROJECT_ATTRIBUTE)
        or os.environ.get("PHOENIX_PROJECT_NAME")
        or service
    )
    return detected.merge(Resource({"service.name": service, PROJECT_ATTRIBUTE: project}))


def build_tracer_provider(
    settings: "telemetry_settings.TelemetrySettings",
) -> TracerProvider | None:
    """A batching provider exporting over OTLP, or None when tracing is off or has nowhere to go.

    The sampler comes from ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default:
    parent-based, always on), read by the SDK.
    """
    if not settings.tracing or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    endpoint = settings.otlp_traces_endpoint
    if not endpoint and not _env(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return None
    provider = TracerProvider(resource=build_resource())
    provider.add_span_processor(
        BatchSpanProcessor(build_exporter(endpoint, settings.otlp_protocol))
    )
    return provider


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Use ``provider`` for Spyglass's spans (tests, embedding programs); None re-reads the settings next time."""
    global _provider, _resolved
    with _lock:
        _provider, _resolved = provider, provider is not None


def tracer_provider(
    settings: "telemetry_settings.TelemetrySettings | None" = None,
) -> TracerProvider | None:
    """The provider Spyglass traces with, built on first use from ``settings`` (default: `settings.current()`).

    The provider is the process's (one exporter pipeline): the first engine to trace builds it.

    Without an OTLP endpoint, an SDK provider that the embedding program installed globally is
    used; otherwise None. A provider built here also becomes the global one if none was set.
    """
    global _provider, _resolved
    settings = settings or telemetry_settings.current()
    with _lock:
        if not _resolved:
            _resolved = True
            _provider = build_tracer_provider(settings)
            global_provider = trace.get_tracer_provider()
            if _provider is None and isinstance(global_provider, TracerProvider):
                _provider = global_provider if settings.tracing else None
            elif _provider is not None and not isinstance(global_provider, TracerProvider):
                trace.set_tracer_provider(_provider)
        return _provider


def get_tracer(
    settings: "telemetry_settings.TelemetrySettings | None" = None,
) -> trace.Tracer | None:
    """Spyglass's tracer, or None when nothing would record the spans (``settings`` as for `tracer_provider`)."""
    provider = tracer_provider(settings)
    return provider.get_tracer(TRACER_NAME) if provider is not None else None


def remember_request_span(request: object, span_context: SpanContext) -> None:
    """Note the span that represents ``request`` (the tracing plugin calls this), for exemplars and logs."""
    _request_spans[request] = span_context


def span_context_of(request) -> SpanContext | None:
    """The request's own span if the tracing plugin made one, else the HTTP span it was captured under."""
    span_context = _request_spans.get(request)
    if span_context is None:
        parent = request.attributes.get("otel_context")
        if isinstance(parent, Context):
            span_context = trace.get_current_span(parent).get_span_context()
    return span_context if span_context is not None and span_context.is_valid else None


def trace_ids(request) -> dict[str, str]:
    """``{"trace_id", "span_id"}`` in W3C hex for the request's span, or empty strings without one."""
    span_context = span_context_of(request)
    if span_context is None:
        return {"trace_id": "", "span_id": ""}
    return {
        "trace_id": format(span_context.trace_id, "032x"),
        "span_id": format(span_context.span_id, "016x"),
    }
