"""The ASGI telemetry middleware: W3C context in, a SERVER span around the handler, request counts."""

import asyncio

import httpx
from litestar import Litestar, get
from litestar.params import FromPath
from opentelemetry import context, trace
from prometheus_client import REGISTRY

from spyglass.telemetry.http import TelemetryMiddleware, remember_exception

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@get("/v1/items/{item_id:int}")
async def item(item_id: FromPath[int]) -> dict:
    span_context = trace.get_current_span(context.get_current()).get_span_context()
    return {
        "trace_id": format(span_context.trace_id, "032x"),
        "span_id": format(span_context.span_id, "016x"),
    }


@get("/metrics")
async def metrics() -> str:
    return "ok"


@get("/boom")
async def boom() -> None:
    raise RuntimeError("boom")


def count(route: str, status: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "spyglass:http_requests_total", {"route": route, "status": status}
        )
        or 0.0
    )


async def _requests(app):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        traced = await client.get(
            "/v1/items/3",
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-Id": "abc-123"},
        )
        fresh = await client.get(
            "/v1/items/4", headers={"X-Request-Id": "not a token " + "x" * 200}
        )
        missing = await client.get("/nope")
        scrape = await client.get("/metrics")
        failed = await client.get("/boom")
    return traced, fresh, missing, scrape, failed


def test_server_spans_parent_on_traceparent_and_requests_are_counted(span_exporter):
    app = TelemetryMiddleware(
        Litestar(
            [item, metrics, boom],
            debug=False,
            logging_config=None,
            after_exception=[remember_exception],
        )
    )
    route = "/v1/items/{item_id}"  # the template, not the path: bounded label values
    before = {
        key: count(*key)
        for key in [(route, "200"), ("unmatched", "404"), ("/metrics", "200"), ("/boom", "500")]
    }
    traced, fresh, missing, scrape, failed = asyncio.run(_requests(app))
    statuses = [r.status_code for r in (traced, fresh, missing, scrape, failed)]
    assert statuses == [200, 200, 404, 200, 500]

    spans = {s.context.span_id: s for s in span_exporter.get_finished_spans()}
    server = spans[int(traced.json()["span_id"], 16)]  # the handler saw the server span as current
    assert server.name == f"GET {route}" and server.kind == trace.SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == TRACE_ID == traced.json()["trace_id"]
    assert server.parent.span_id == int(PARENT_ID, 16) and server.parent.is_remote
    assert (
        server.attributes["http.route"] == route
        and server.attributes["http.response.status_code"] == 200
    )
    assert server.attributes["url.path"] == "/v1/items/3"

    own = spans[int(fresh.json()["span_id"], 16)]
    assert own.parent is None and format(own.context.trace_id, "032x") != TRACE_ID
    names = sorted(s.name for s in spans.values())
    assert names == ["GET", "GET /boom", f"GET {route}", f"GET {route}"]  # no span for the scrape
    (error_span,) = [s for s in spans.values() if s.name == "GET /boom"]
    assert (
        error_span.status.status_code == trace.StatusCode.ERROR
        and error_span.attributes["error.type"] == "500"
    )
    (exception,) = [e for e in error_span.events if e.name == "exception"]
    assert exception.attributes["exception.type"] == "RuntimeError"
    (missing_span,) = [s for s in spans.values() if s.name == "GET"]
    assert (
        missing_span.attributes["error.type"] == "404"
    )  # a client error: marked, status left unset
    assert missing_span.status.status_code == trace.StatusCode.UNSET

    # The request id: the client's when it is a plain token, else one the server makes; on every response.
    assert (
        traced.headers["x-request-id"] == "abc-123" == server.attributes["spyglass.http.request_id"]
    )
    assert len(fresh.headers["x-request-id"]) == 32 and scrape.headers["x-request-id"]
    # traceparent names the server span, so a client can find its trace.
    assert (
        traced.headers["traceparent"]
        == f"00-{TRACE_ID}-{format(server.context.span_id, '016x')}-01"
    )
    assert fresh.headers["traceparent"].split("-")[1] == format(own.context.trace_id, "032x")
    assert "traceparent" not in scrape.headers  # no span for a scrape

    assert count(route, "200") - before[(route, "200")] == 2
    assert count("unmatched", "404") - before[("unmatched", "404")] == 1
    assert count("/metrics", "200") - before[("/metrics", "200")] == 1
    assert count("/boom", "500") - before[("/boom", "500")] == 1
    assert (
        REGISTRY.get_sample_value("spyglass:http_request_duration_seconds_count", {"route": route})
        >= 2
    )


def test_lifespan_passes_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(TelemetryMiddleware(app)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_a_client_that_leaves_mid_response_marks_the_server_span_aborted(span_exporter):
    async def streaming(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"  # how a streaming handler learns it

    async def client_leaves():
        messages = iter(
            [{"type": "http.request", "body": b"", "more_body": False}, {"type": "http.disconnect"}]
        )

        async def receive():
            return next(messages)

        async def send(message):
            pass

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/completions",
            "headers": [],
            "scheme": "http",
        }
        await receive()  # the request body, read by the server before the handler runs
        await TelemetryMiddleware(streaming)(scope, receive, send)

    asyncio.run(client_leaves())
    (span,) = span_exporter.get_finished_spans()
    assert (
        span.attributes["error.type"] == "abort"
        and span.attributes["http.response.status_code"] == 200
    )
    assert [event.name for event in span.events] == ["client disconnected"]
    assert span.status.status_code == trace.StatusCode.UNSET  # the server did nothing wrong


@get("/refuse", status_code=400)
async def refuse() -> dict:
    error = {"type": "invalid_request_error", "code": "unknown_parameter"}
    return {"error": {**error, "message": "Unrecognized request argument", "param": "x" * 300}}


def test_an_error_bodys_code_and_field_go_on_the_span_and_the_code_on_a_counter(span_exporter):
    app = TelemetryMiddleware(Litestar([refuse], debug=False, logging_config=None))
    labels = {"route": "/refuse", "status": "400", "code": "unknown_parameter"}
    missing = {"route": "unmatched", "status": "404", "code": "none"}
    before = [
        REGISTRY.get_sample_value("spyglass:http_errors_total", x) or 0 for x in (labels, missing)
    ]

    async def calls():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.get("/refuse"), await client.get("/nope")

    refused, not_found = asyncio.run(calls())
    assert (refused.status_code, not_found.status_code) == (400, 404)
    after = [REGISTRY.get_sample_value("spyglass:http_errors_total", x) for x in (labels, missing)]
    assert [a - b for a, b in zip(after, before)] == [1, 1]
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == "GET /refuse"]
    assert span.attributes["spyglass.error.code"] == "unknown_parameter"
    assert span.attributes["spyglass.error.param"] == "x" * 128  # a made-up field: cut short
