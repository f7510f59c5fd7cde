"""The HTTP server span is the top of a request's trace: give it what trace lists show.

Phoenix's trace table and Langfuse's trace view read the root span: its OpenInference kind,
``input.value`` and ``output.value``, ``user.id`` and ``session.id``. The telemetry middleware
opens that span with the HTTP facts; this module adds the generation's, from the engine
request whose context it parents:

- ``openinference.span.kind`` CHAIN (the LLM span below it stays the one LLM span, so token
  counts and costs are not counted twice) and ``langfuse.trace.name`` ``{operation} {model}``;
- ``user.id`` and ``session.id`` (the ``X-Session-Id`` header, else ``metadata.session_id``);
- the call's ``metadata``: OpenInference's ``metadata`` (JSON) and, per key, Langfuse's
  ``langfuse.trace.metadata.{key}``;
- with content capture on, the input (messages as JSON, or the prompt) and the first choice's
  output: its text, or, for a chat answer that reasoned or called tools, its assistant message
  as JSON (the calls parsed, as the client got them);
- on an engine failure, ERROR status, ``error.type`` and the exception, as on the LLM span.

A call with several choices touches the root once, through its first choice.
"""

import json
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from spyglass.core.plugin_api import FinishReason, Request
from spyglass.plugins.tracing import attributes as attrs
from spyglass.telemetry.request_context import operation_name


def server_span(request: Request) -> Span | None:
    """The recording HTTP SERVER span the request was submitted under, if any."""
    parent = request.attributes.get("otel_context")
    if not isinstance(parent, Context):
        return None
    span = trace.get_current_span(parent)
    return span if span.is_recording() and getattr(span, "kind", None) is SpanKind.SERVER else None


def ended_at(span: Span | None) -> int | None:
    """When ``span`` ended (epoch ns), or None while it is open."""
    return getattr(span, "end_time", None) if span is not None else None


def is_first_choice(request: Request) -> bool:
    """Whether the request is choice 0 of its API call (ids are ``{id}`` or ``{id}-{i}``)."""
    api_id = request.attributes.get("api_request_id")
    return api_id is None or request.req_id in (api_id, f"{api_id}-0")


def on_added(span: Span, request: Request, model: str, prompt_text: str | None) -> None:
    """Kind, trace name, user, session and metadata; the input when ``prompt_text`` is given
    (content capture on)."""
    extra = request.attributes
    values = {
        "openinference.span.kind": "CHAIN",
        "langfuse.trace.name": f"{operation_name(request)} {model}",
        "user.id": extra.get("user"),
        "langfuse.user.id": extra.get("user"),
        "session.id": attrs.session_id(request),
        "langfuse.session.id": attrs.session_id(request),
        "metadata": attrs.metadata_json(request),
    }
    for key, value in (extra.get("metadata") or {}).items():
        values[f"langfuse.trace.metadata.{key}"] = value
    span.set_attributes({k: v for k, v in values.items() if v is not None})
    if prompt_text is not None:
        messages = extra.get("messages")
        if messages:
            span.set_attributes(
                {"input.value": json.dumps(messages), "input.mime_type": "application/json"}
            )
        else:
            span.set_attributes({"input.value": prompt_text, "input.mime_type": "text/plain"})


@dataclass(frozen=True, slots=True)
class Output:
    """What the trace shows as the call's output: the text, or a chat answer's message as JSON."""

    value: str
    mime_type: str = "text/plain"


def on_finished(span: Span, request: Request, reason: FinishReason, output: Output | None) -> None:
    """The output (content capture on) and, for an engine failure, the error."""
    if output is not None:
        span.set_attributes({"output.value": output.value, "output.mime_type": output.mime_type})
    if reason is FinishReason.ERROR:
        record_failure(span, request.error)


def record_failure(span: Span, error: str | None) -> None:
    """ERROR status, ``error.type`` and an ``exception`` event, per OpenTelemetry's error conventions."""
    error_type = attrs.error_type(error)
    span.set_attribute("error.type", error_type)
    span.add_event("exception", {"exception.type": error_type, "exception.message": error or ""})
    span.set_status(Status(StatusCode.ERROR, error))
