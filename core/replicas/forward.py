"""HTTP requests carried from the ingress to a replica's ASGI app and back, as plain picklable data.

The ingress (`IngressApp`) reads a request, names its prompt's prefix blocks for the router, and
hands a `ForwardedRequest` to ``open_stream``; the replica runs it through its own Spyglass app
(`call_app`) and streams back a `ResponseStart` and then the body's chunks. When the client goes
away the ingress closes the stream, the replica's generator is cancelled, and its app sees an
``http.disconnect``: the same path that aborts engine requests in a single server.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec
from opentelemetry import context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from spyglass.core.api.errors import error_body
from spyglass.core.replicas.kept_affinity import kept_keeper
from spyglass.core.replicas.prefix import routing_blocks
from spyglass.telemetry.exposition import render_metrics
from spyglass.telemetry.request_context import REQUEST_ID_HEADER, info_in

Headers = list[tuple[bytes, bytes]]
# Set per hop: the ingress sends its own span's context and request id; the replica's are dropped on the way back.
_PER_HOP = {b"traceparent", b"tracestate", REQUEST_ID_HEADER.encode()}
_propagator = TraceContextTextMapPropagator()
log = logging.getLogger("spyglass.replicas")


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """One HTTP request as the ingress received it, with what the router chooses its replica by:
    its prompt's prefix block names, and the tag of the replica that keeps the Responses API
    response it continues or is about (`kept_affinity`), if any."""

    method: str
    path: str
    query_string: bytes
    headers: Headers
    body: bytes
    prefix_blocks: tuple[int, ...] = ()
    client: tuple[str, int] | None = None
    server: tuple[str, int] | None = None
    keeper: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseStart:
    """The status and headers of a forwarded response: the first item a replica's stream yields."""

    status: int
    headers: Headers = field(default_factory=list)


def _scope(request: ForwardedRequest) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query_string,
        "headers": request.headers,
        "client": request.client,
        "server": request.server,
        "state": {},
    }


async def call_app(app, request: ForwardedRequest, extra_headers: Headers = ()) -> AsyncIterator:
    """Run ``request`` through the ASGI ``app``: yields a `ResponseStart`, then the body's chunks (bytes).

    Closing or cancelling the generator early sends the app an ``http.disconnect`` and waits a
    little for it to clean up (a stream aborts its engine requests then), then cancels it.
    """
    messages: asyncio.Queue = asyncio.Queue()
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    task = asyncio.ensure_future(app(_scope(request), receive, messages.put))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                yield ResponseStart(
                    message["status"], [*message.get("headers", []), *extra_headers]
                )
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    break
        disconnected.set()  # as from a server: once the response is complete, receive() answers a disconnect
        await task  # raises what the app raised
    finally:
        disconnected.set()
        if not task.done():
            await asyncio.wait({task}, timeout=5)
            task.cancel()


class IngressApp:
    """The ingress's ASGI app: every HTTP call is forwarded to a replica, except ``GET /metrics``.

    ``open_stream(request)`` starts the call on a replica and returns an async generator of its
    `ResponseStart` and body chunks; an exception of a ``retry_on`` type before the response starts
    (the chosen replica died) is retried once, on whichever replica the router picks next.
    ``/metrics`` answers the ingress's own (HTTP) metrics; each replica's engine metrics are
    scraped from the replica's own port. Wrap it in `TelemetryMiddleware` so that each forwarded
    call carries the ingress span as its ``traceparent`` and the ingress's request id. A path in
    ``routes`` (the replicas' route templates) names the call's span and metrics as the replica's
    does; others are ``unmatched``, so that arbitrary paths never become label values.
    """

    def __init__(
        self,
        open_stream: Callable[[ForwardedRequest], AsyncIterator],
        max_body_bytes: int,
        retry_on: tuple[type[BaseException], ...] = (),
        routes: frozenset[str] = frozenset(),
    ):
        self.open_stream = open_stream
        self.max_body_bytes = max_body_bytes
        self.retry_on = retry_on
        self.routes = routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] in self.routes:
            scope["path_template"] = scope[
                "path"
            ]  # read by TelemetryMiddleware once the call is done
        if scope["method"] == "GET" and scope["path"] == "/metrics":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            body, content_type = render_metrics(headers.get("accept"))
            await _respond(send, 200, body, content_type)
            return
        body = await _read_body(receive, self.max_body_bytes)
        if body is None:
            await _respond_error(
                send, 413, f"the request body is larger than {self.max_body_bytes} bytes"
            )
            return
        await self._forward(self._request(scope, body), receive, send)

    @staticmethod
    def _request(scope, body: bytes) -> ForwardedRequest:
        carrier: dict[str, str] = {}
        _propagator.inject(
            carrier
        )  # the ingress's SERVER span: the replica's span becomes its child
        info = info_in(context.get_current())
        if info is not None:
            carrier[REQUEST_ID_HEADER] = info.request_id
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _PER_HOP]
        headers += [(k.encode(), v.encode()) for k, v in carrier.items()]
        blocks = routing_blocks(body) if scope["method"] == "POST" else ()
        return ForwardedRequest(
            scope["method"],
            scope["path"],
            scope.get("query_string", b""),
            headers,
            body,
            blocks,
            tuple(scope["client"]) if scope.get("client") else None,
            tuple(scope["server"]) if scope.get("server") else None,
            kept_keeper(scope["method"], scope["path"], body),
        )

    async def _start(self, request: ForwardedRequest) -> tuple[AsyncIterator, ResponseStart]:
        for attempt in (1, 2):
            stream = self.open_stream(request)
            try:
                return stream, await anext(stream)
            except self.retry_on:
                await stream.aclose()
                if attempt == 2:
                    raise
                log.warning(
                    "the replica died before answering %s %s; retrying once",
                    request.method,
                    request.path,
                )
        raise AssertionError("unreachable")

    async def _forward(self, request: ForwardedRequest, receive, send) -> None:
        try:
            stream, start = await self._start(request)
        except Exception as error:
            log.exception("no replica answered %s %s", request.method, request.path)
            message = f"no replica could serve the request: {type(error).__name__}"
            await _respond_error(send, 503, message, code="replica_unavailable")
            return
        pump = asyncio.ensure_future(self._pump(stream, start, send))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watcher):
                task.cancel()
            await asyncio.gather(pump, watcher, return_exceptions=True)
            await stream.aclose()
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            raise pump.exception()

    @staticmethod
    async def _pump(stream: AsyncIterator, start: ResponseStart, send) -> None:
        headers = [(k, v) for k, v in start.headers if k.lower() not in _PER_HOP]
        await send({"type": "http.response.start", "status": start.status, "headers": headers})
        async for chunk in stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole request body, or None once it exceeds ``limit`` bytes."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return bytes(body)
        body.extend(message.get("body", b""))
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(send, status: int, body: bytes, content_type: str) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _respond_error(send, status: int, message: str, code: str | None = None) -> None:
    await _respond(
        send,
        status,
        msgspec.json.encode(error_body(status, message, code=code)),
        "application/json",
    )
