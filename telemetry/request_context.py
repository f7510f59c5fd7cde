"""What the HTTP layer knows about a request, carried in the OpenTelemetry context to the engine's hooks.

The telemetry middleware puts an `HttpRequestInfo` into the context it attaches around the
handler; the API captures that context in ``request.attributes["otel_context"]`` (for span
parenting), so the engine-side plugins read the request id, session and server address from
there without the API passing each one along.
"""

import re
import uuid
from dataclasses import dataclass

from opentelemetry import context

REQUEST_ID_HEADER = "x-request-id"
SESSION_ID_HEADER = "x-session-id"
# A client's id is echoed in a response header and written to logs: keep it short and inert.
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
_KEY = context.create_key("spyglass.http_request")


@dataclass(frozen=True, slots=True)
class HttpRequestInfo:
    """The HTTP request an engine request came from: its id, the client's session, the server's address."""

    request_id: str
    session_id: str | None = None
    server_address: str | None = None
    server_port: int | None = None


def request_id_from(header: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a plain token of at most 128 characters, else a new one."""
    if header and _CLIENT_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def session_id_from(header: str | None) -> str | None:
    """The client's ``X-Session-Id``, at most 256 characters (it becomes a span attribute), or None."""
    return (header.strip()[:256] or None) if header else None


def with_info(info: HttpRequestInfo, parent: context.Context | None = None) -> context.Context:
    """``parent`` (default: the current context) carrying ``info``."""
    return context.set_value(_KEY, info, parent)


def info_in(ctx: context.Context | None) -> HttpRequestInfo | None:
    """The `HttpRequestInfo` in ``ctx``, if the request came through the middleware."""
    if not isinstance(ctx, context.Context):
        return None
    info = context.get_value(_KEY, ctx)
    return info if isinstance(info, HttpRequestInfo) else None


def info_of(request) -> HttpRequestInfo | None:
    """The `HttpRequestInfo` of an engine request (from the context captured in its attributes)."""
    return info_in(request.attributes.get("otel_context"))


def operation_name(request) -> str:
    """GenAI's ``gen_ai.operation.name`` of an engine request: ``embeddings`` for an embedding
    request, ``classify`` for a classification (Spyglass's: GenAI names none), else ``chat`` or
    ``text_completion`` (what the HTTP handler put in ``request.attributes["operation"]``;
    offline requests are completions)."""
    pooling = request.sampling_params.pooling
    if pooling is not None:
        return "embeddings" if pooling.task == "embed" else "classify"
    return request.attributes.get("operation", "text_completion")
