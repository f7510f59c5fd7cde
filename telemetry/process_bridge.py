"""Telemetry across the engine process's boundary (``spyglass serve --engine-process``).

The engine and its plugins run in a child process: there they need the server's logging and
telemetry settings (`prepare_engine_process`), each request's trace context as W3C headers rather
than a live context object (`export_attributes` in the server, `import_attributes` in the engine
process), and the server's ``/metrics`` reads the child's registry (`collect_metric_families`).
"""

import sys
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import REGISTRY

from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.logging import setup_logging
from spyglass.telemetry.request_context import HttpRequestInfo, info_in, with_info
from spyglass.telemetry.server_span_mirror import (
    ChangeJournal,
    OpenServerSpans,
    ServerSpanMirror,
    SpanChange,
)

_propagator = TraceContextTextMapPropagator()
_journal = ChangeJournal()  # in the engine process
_open_spans = OpenServerSpans()  # in the server process


@dataclass(frozen=True, slots=True)
class PortableContext:
    """A request's trace context as W3C ``traceparent``/``tracestate`` headers, and its HTTP request."""

    headers: dict[str, str]
    info: HttpRequestInfo | None
    mirrored: bool = False
    """Whether the context's span is a recording SERVER span, to mirror in the engine process."""


def prepare_engine_process(settings: telemetry_settings.TelemetrySettings) -> None:
    """In the engine process, before its engine loads: the server's log schema and telemetry settings."""
    setup_logging(stream=sys.stderr)
    telemetry_settings.configure(settings)


def export_attributes(attributes: dict) -> dict:
    """A request's attributes with its OpenTelemetry context made a `PortableContext` (in the server)."""
    context = attributes.get("otel_context")
    if not isinstance(context, Context):
        return attributes
    headers: dict[str, str] = {}
    _propagator.inject(headers, context)
    span = trace.get_current_span(context)
    mirrored = span.is_recording() and getattr(span, "kind", None) is SpanKind.SERVER
    if mirrored:
        _open_spans.remember(span)
    portable = PortableContext(headers, info_in(context), mirrored)
    return {**attributes, "otel_context": portable}


def import_attributes(attributes: dict) -> dict:
    """The attributes `export_attributes` made, with a context again (in the engine process)."""
    portable = attributes.get("otel_context")
    if not isinstance(portable, PortableContext):
        return attributes
    context = _propagator.extract(portable.headers)
    if portable.mirrored:
        remote = trace.get_current_span(context).get_span_context()
        context = trace.set_span_in_context(ServerSpanMirror(remote, _journal), context)
    if portable.info is not None:
        context = with_info(portable.info, context)
    return {**attributes, "otel_context": context}


def collect_metric_families() -> list:
    """Every metric family of this process's Prometheus registry, samples included (they pickle)."""
    return list(REGISTRY.collect())


def drain_span_changes() -> list[SpanChange]:
    """What the engine process's plugins set on mirrored server spans since the last call."""
    return _journal.drain()


def apply_span_changes(changes: list[SpanChange]) -> None:
    """Apply the engine process's changes to the server's spans that are still open."""
    _open_spans.apply(changes)


def mark_abandoned(attributes: dict, when_ns: int) -> None:
    """The client of a request left at ``when_ns``: its mirrored server span counts as ended there."""
    span = trace.get_current_span(attributes.get("otel_context"))
    if isinstance(span, ServerSpanMirror) and span.end_time is None:
        span.end_time = when_ns
