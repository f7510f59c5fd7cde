"""HTTP telemetry as pure ASGI middleware: a SERVER span, a request id, an access-log line, request counts.

Wrap the whole application (``TelemetryMiddleware(litestar_app)`` handed to uvicorn) so that 404s
are counted and logged too. Per request it

- adopts the client's ``X-Request-Id`` (or makes one) and returns it, with the ``traceparent`` of
  the server span, on every response;
- opens a SERVER span parented on the incoming W3C context; inside a handler,
  ``opentelemetry.context.get_current()`` carries that span and an `HttpRequestInfo`, which the
  API stores in ``request.attributes["otel_context"]`` so the engine's spans and logs join it;
- sets ``error.type`` on 4xx and 5xx, and ERROR status on 5xx (OpenTelemetry's HTTP conventions),
  with the exception that caused a 5xx (`remember_exception`); an error's code and the field it
  names (``spyglass.error.code``, ``spyglass.error.param``) on the span, and its code on
  ``spyglass:http_errors_total``;
- logs one ``spyglass.access`` line with the request id, trace id, status, duration and, for an
  error response, the reason from its OpenAI error body.
"""

import json
import logging
import time
from dataclasses import dataclass

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from spyglass.telemetry import metrics, tracing
from spyglass.telemetry.logging import get_logger
from spyglass.telemetry.request_context import (
    REQUEST_ID_HEADER,
    SESSION_ID_HEADER,
    HttpRequestInfo,
    request_id_from,
    session_id_from,
    with_info,
)

UNMATCHED_ROUTE = "unmatched"
ACCESS_LOGGER = "spyglass.access"
EXCEPTION_KEY = "spyglass.exception"
MAX_ERROR_BODY = 8192
MAX_PARAM_CHARS = 128
_propagator = TraceContextTextMapPropagator()
access_log = get_logger(ACCESS_LOGGER)


def _headers(scope) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope.get("headers", [])
    }


def _route(scope) -> str:
    """The route template the framework matched (Litestar sets ``path_template``), never the raw path."""
    return scope.get("path_template") or scope.get("route") or UNMATCHED_ROUTE


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """What an OpenAI error body says: why (``message``), its ``code`` (``"none"`` without one: a
    label value) and the request field it names (``param``, cut to `MAX_PARAM_CHARS`: a field a
    client made up can be any length)."""

    message: str | None
    code: str = "none"
    param: str | None = None


def _error_body(body: bytes) -> ErrorBody:
    """The error an OpenAI error body describes; all unknown when the body is something else."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ErrorBody(None)
    if not isinstance(error, dict):
        return ErrorBody(None)
    message, code, param = (error.get(key) for key in ("message", "code", "param"))
    return ErrorBody(
        str(message) if message else None,
        str(code) if code else "none",
        str(param)[:MAX_PARAM_CHARS] if param else None,
    )


def _response_headers(request_id: str, span: trace.Span) -> list[tuple[bytes, bytes]]:
    headers = [(REQUEST_ID_HEADER.encode(), request_id.encode())]
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, trace.set_span_in_context(span))
    headers += [(name.encode(), value.encode()) for name, value in carrier.items()]
    return headers


def remember_exception(exception: BaseException, scope) -> None:
    """An ``after_exception`` hook for the framework: keep the exception for the span, if it ends in a 5xx.

    The framework turns exceptions into error responses, so the middleware never sees them raised;
    with this, a 5xx span records the exception that caused it.
    """
    scope[EXCEPTION_KEY] = exception


class TelemetryMiddleware:
    """Traces, logs and counts every HTTP request; lifespan and websocket scopes pass straight through.

    Paths in ``quiet_paths`` (the Prometheus scrape, liveness probes) are counted but get no span
    and, unless they fail, no access-log line, so a scrape every few seconds floods neither the
    trace store nor the logs. ``access_log`` False drops the access-log lines altogether.
    """

    def __init__(
        self, app, quiet_paths: tuple[str, ...] = ("/metrics", "/health"), access_log: bool = True
    ):
        self.app = app
        self.quiet_paths = quiet_paths
        self.access_log = access_log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        method = scope.get("method", "GET")
        path = scope.get("path", "")
        quiet = path in self.quiet_paths
        server = scope.get("server") or (None, None)
        info = HttpRequestInfo(
            request_id=request_id_from(headers.get(REQUEST_ID_HEADER)),
            session_id=session_id_from(headers.get(SESSION_ID_HEADER)),
            server_address=server[0],
            server_port=server[1],
        )
        parent = _propagator.extract(headers)
        tracer = tracing.get_tracer() if not quiet else None
        span = trace.INVALID_SPAN
        if tracer is not None:
            attributes = self._attributes(scope, headers, info)
            span = tracer.start_span(
                method, context=parent, kind=SpanKind.SERVER, attributes=attributes
            )
        token = context.attach(with_info(info, trace.set_span_in_context(span, parent)))
        status, error_body = 500, bytearray()
        start = time.perf_counter()
        completed = disconnected = False

        async def receive_and_watch():
            nonlocal disconnected
            message = await receive()
            disconnected = disconnected or (message["type"] == "http.disconnect" and not completed)
            return message

        async def send_and_watch(message) -> None:
            nonlocal status, completed
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            if message["type"] == "http.response.start":
                status = message["status"]
                extended = [*message.get("headers", []), *_response_headers(info.request_id, span)]
                message = {**message, "headers": extended}
            elif (
                message["type"] == "http.response.body"
                and status >= 400
                and len(error_body) < MAX_ERROR_BODY
            ):
                error_body.extend(message.get("body", b"")[: MAX_ERROR_BODY - len(error_body)])
            await send(message)

        exception = None
        try:
            await self.app(scope, receive_and_watch, send_and_watch)
        except BaseException as error:
            exception = error
            span.record_exception(error)
            raise
        finally:
            route = _route(scope)
            error = _error_body(bytes(error_body)) if error_body else ErrorBody(None)
            reason = error.message
            if exception is not None:
                reason = f"{type(exception).__name__}: {exception}"
            handled = scope.get(EXCEPTION_KEY)
            if handled is not None and status >= 500 and span.is_recording():
                span.record_exception(handled)
            if disconnected and span.is_recording():  # the client left before the response ended
                span.set_attribute("error.type", "abort")
                span.add_event("client disconnected")
            self._end_span(span, method, route, status, reason, error)
            context.detach(token)
            duration = time.perf_counter() - start
            metrics.HTTP_REQUESTS.labels(route, str(status)).inc()
            if status >= 400:
                metrics.HTTP_ERRORS.labels(route, str(status), error.code).inc()
            metrics.HTTP_REQUEST_DURATION.labels(route).observe(duration)
            if self.access_log and (not quiet or status >= 400):
                self._log(scope, method, route, status, duration, info, span, reason)

    @staticmethod
    def _attributes(scope, headers: dict[str, str], info: HttpRequestInfo) -> dict:
        attributes = {
            "http.request.method": scope.get("method", "GET"),
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", ""),
            "user_agent.original": headers.get("user-agent", ""),
            "client.address": (scope.get("client") or ("",))[0],
            "spyglass.http.request_id": info.request_id,
        }
        optional = {
            "server.address": info.server_address,
            "server.port": info.server_port,
            "session.id": info.session_id,
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        return attributes

    @staticmethod
    def _end_span(
        span: trace.Span,
        method: str,
        route: str,
        status: int,
        reason: str | None,
        error: ErrorBody,
    ) -> None:
        if span.is_recording():
            if route != UNMATCHED_ROUTE:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                span.set_attribute("error.type", str(status))
                span.set_attribute("spyglass.error.code", error.code)
                if error.param is not None:
                    span.set_attribute("spyglass.error.param", error.param)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, reason))
        span.end()

    @staticmethod
    def _log(scope, method, route, status, duration, info: HttpRequestInfo, span, reason) -> None:
        span_context = span.get_span_context()
        level = (
            logging.ERROR if status >= 500 else logging.WARNING if status >= 400 else logging.INFO
        )
        fields = {
            "request_id": info.request_id,
            "trace_id": format(span_context.trace_id, "032x") if span_context.is_valid else "",
            "span_id": format(span_context.span_id, "016x") if span_context.is_valid else "",
            "method": method,
            "path": scope.get("path", ""),
            "route": route,
            "status": status,
            "duration_s": round(duration, 6),
            "client": (scope.get("client") or ("",))[0],
        }
        if reason:
            fields["error"] = reason
        access_log.log(level, "http request", **fields)
