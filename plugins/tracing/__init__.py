"""OpenTelemetry spans for every request, built only on the public hooks.

Per request, a span ``{operation} {model}`` (parented on the HTTP server span captured in
``request.attributes["otel_context"]``, else a new trace) with child spans for each phase it
goes through: ``queue``, ``prefill`` (one event per chunk), ``decode``, and ``preempted`` (from
losing its blocks until it is scheduled again, after which a resumed ``prefill`` recomputes
them). The HTTP server span above it gets the generation's kind, user, session and (with
content capture) input and output (`root_span`); a chat answer's tool calls and reasoning are
read as the API read them (`answer_attributes`). With ``trace_steps``, ``engine_step`` spans,
grouped per busy interval (`step_spans`), link to the request spans they served. Content
(prompt and completion text) is recorded only with ``trace_content``. Every request span carries
``spyglass.engine.id``; the entry point names `TracingPlugin`, so each engine traces only its own
requests, with its own telemetry settings.

Errors follow OpenTelemetry's conventions: an engine failure sets ERROR status, ``error.type``
and an ``exception`` event; an abort sets ``error.type`` ``abort`` and leaves the status unset.
A request's spans never end after the HTTP span above them (an abort is processed after the
response ended; its spans are cut at the response's end).
"""

from spyglass.core.plugin_api import (
    EngineConfig,
    EngineInfo,
    FinishReason,
    PluginContext,
    Request,
    StepStats,
    hookimpl,
)
from spyglass.plugins.tracing.request_tracer import RequestTrace, RequestTracer
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry import tracing

__all__ = ["RequestTrace", "RequestTracer", "TracingPlugin"]


class TracingPlugin:
    """One engine's request spans (the entry point names this class: an instance per engine)."""

    def __init__(self, context: PluginContext):
        self.settings = telemetry_settings.resolve(context.telemetry)
        self.tracer: RequestTracer | None = None

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Start tracing this engine's requests if tracing is on and spans have somewhere to go."""
        tracer = tracing.get_tracer(self.settings) if self.settings.tracing else None
        self.tracer = RequestTracer(tracer, info, self.settings) if tracer is not None else None

    @hookimpl
    def spyglass_engine_stopped(self, info: EngineInfo) -> None:
        """Close any span left open."""
        if self.tracer is not None:
            self.tracer.stopped()
            self.tracer = None

    @hookimpl(tryfirst=True)
    def spyglass_request_added(self, request: Request) -> None:
        """Open the request span and its queue span (first, so other plugins can log its trace id)."""
        if self.tracer is not None:
            self.tracer.added(request)

    @hookimpl
    def spyglass_request_scheduled(self, request: Request, resumed: bool) -> None:
        """End the queue (or preempted) span; open a prefill span."""
        if self.tracer is not None:
            self.tracer.scheduled(request, resumed)

    @hookimpl
    def spyglass_request_first_token(self, request: Request) -> None:
        """Mark the first token."""
        if self.tracer is not None:
            self.tracer.first_token(request)

    @hookimpl
    def spyglass_request_preempted(self, request: Request) -> None:
        """End the running phase; open a preempted span."""
        if self.tracer is not None:
            self.tracer.preempted(request)

    @hookimpl(tryfirst=True)
    def spyglass_request_finished(self, request: Request, reason: FinishReason) -> None:
        """Set usage, timings and finish reason; end the request's spans."""
        if self.tracer is not None:
            self.tracer.finished(request, reason)

    @hookimpl
    def spyglass_step_started(self, step_id: int, scheduled: tuple[Request, ...]) -> None:
        """Note what each scheduled request had computed, and the links for the step span."""
        if self.tracer is not None:
            self.tracer.step_started(step_id, scheduled)

    @hookimpl
    def spyglass_step_finished(self, stats: StepStats) -> None:
        """Prefill chunk events, prefill-to-decode switches, and the optional step span."""
        if self.tracer is not None:
            self.tracer.step_finished(stats)
