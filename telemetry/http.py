"""HTTP telemetry as pure ASGI middleware: a SERVER span per request, W3C context in, request counts out.

Wrap the whole application (``TelemetryMiddleware(litestar_app)`` handed to uvicorn) so that 404s
are counted too. Inside a handler, ``opentelemetry.context.get_current()`` carries the server
span; the API stores it in ``request.attributes["otel_context"]`` so the engine's request span
becomes its child, whether or not the client sent a ``traceparent``.
"""

import time

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from spyglass.telemetry import metrics, tracing

UNMATCHED_ROUTE = "unmatched"
_propagator = TraceContextTextMapPropagator()


def _headers(scope) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}


def _route(scope) -> str:
    """The route template the framework matched (Litestar sets ``path_template``), never the raw path."""
    return scope.get("path_template") or scope.get("route") or UNMATCHED_ROUTE


class TelemetryMiddleware:
    """Traces and counts every HTTP request; lifespan and websocket scopes pass straight through.

    Paths in ``untraced_paths`` (the Prometheus scrape, health checks) are counted but get no
    span, so a scrape every few seconds does not flood the trace store.
    """

    def __init__(self, app, untraced_paths: tuple[str, ...] = ("/metrics", "/health")):
        self.app = app
        self.untraced_paths = untraced_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        method = scope.get("method", "GET")
        parent = _propagator.extract(headers)
        tracer = tracing.get_tracer() if scope.get("path") not in self.untraced_paths else None
        span = trace.INVALID_SPAN
        if tracer is not None:
            span = tracer.start_span(
                method,
                context=parent,
                kind=SpanKind.SERVER,
                attributes={
                    "http.request.method": method,
                    "url.path": scope.get("path", ""),
                    "url.scheme": scope.get("scheme", "http"),
                    "network.protocol.version": scope.get("http_version", ""),
                    "user_agent.original": headers.get("user-agent", ""),
                    "client.address": (scope.get("client") or ("",))[0],
                },
            )
        token = context.attach(trace.set_span_in_context(span, parent))
        status = 500
        start = time.perf_counter()

        async def send_and_watch(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        except BaseException as error:
            span.record_exception(error)
            raise
        finally:
            route = _route(scope)
            if span.is_recording():
                if route != UNMATCHED_ROUTE:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                    span.set_attribute("error.type", str(status))
            span.end()
            context.detach(token)
            metrics.HTTP_REQUESTS.labels(route, str(status)).inc()
            metrics.HTTP_REQUEST_DURATION.labels(route).observe(time.perf_counter() - start)
