"""Batches in OpenAI's batch file format, answered by the API in this process (``spyglass
run-batch``, as vLLM's ``run-batch``).

Each input line is ``{"custom_id", "method": "POST", "url": "/v1/...", "body": {...}}``; each
output line is ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``,
in the input's order, written as soon as the lines before it are done. A request goes through the
same routes, checks and engine as one sent to ``spyglass serve``: a bad body is a 4xx in its line's
``response``, as OpenAI's batches report it, and never stops the others. A line that cannot be
sent at all (not JSON, not a POST to ``/v1/``, a streamed body), or whose call failed outside
the API's error handling, has ``response`` null and its reason in ``error``. A line the server
turns away while its queue is full (429) waits and is sent again. At most
``max_concurrency`` requests are in flight at once. With ``listen`` (a host and port) the same
app also answers HTTP there while the batch runs, for Prometheus to scrape its ``/metrics`` and
an operator to read ``/debug/kv`` (vLLM's ``--enable-metrics``).
"""

import asyncio
import json
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TextIO

import httpx
import uvicorn
from litestar import Litestar

from spyglass.telemetry.http import TelemetryMiddleware
from spyglass.telemetry.request_context import REQUEST_ID_HEADER

log = logging.getLogger("spyglass.batch")


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One input line: the request it asks for, or why it cannot be sent (``problem``)."""

    custom_id: object
    url: str = ""
    body: dict | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """How a batch went: lines answered 2xx, answered with an error status, and not sent."""

    succeeded: int
    failed: int
    not_sent: int


def read_line(text: str) -> BatchLine:
    """The request one line of a batch file asks for."""
    try:
        line = json.loads(text)
    except json.JSONDecodeError as error:
        return BatchLine(None, problem=f"the line is not JSON: {error}")
    if not isinstance(line, dict):
        return BatchLine(None, problem="the line is not a JSON object")
    custom_id, url, body = line.get("custom_id"), line.get("url"), line.get("body")
    if line.get("method", "POST") != "POST":
        return BatchLine(custom_id, problem="only POST requests can be batched")
    if not isinstance(url, str) or not url.startswith("/v1/"):
        return BatchLine(custom_id, problem="url must be an API path such as /v1/chat/completions")
    if not isinstance(body, dict):
        return BatchLine(custom_id, problem="body must be a JSON object")
    if body.get("stream"):
        return BatchLine(custom_id, problem="a batched request cannot be streamed")
    return BatchLine(custom_id, url, body)


def outcome(result: dict) -> str:
    """How an output line went: ``succeeded`` (a 2xx), ``failed`` (an error status) or
    ``not_sent``."""
    status = result["response"] and result["response"]["status_code"]
    return "not_sent" if status is None else "failed" if status >= 400 else "succeeded"


@asynccontextmanager
async def in_process_client(
    app: Litestar, headers: dict[str, str] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that calls ``app`` (already started) in this process, through the same
    telemetry as a served call (its spans and metrics), sending ``headers`` with every call."""
    transport = httpx.ASGITransport(app=TelemetryMiddleware(app, access_log=False))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://spyglass-batch", timeout=None, headers=headers
    ) as client:
        yield client


async def answer_lines(
    client: httpx.AsyncClient,
    lines: Iterable[str],
    max_concurrency: int,
    on_result: Callable[[dict], None],
    read: Callable[[str], BatchLine] = read_line,
) -> None:
    """Answer every non-blank line of ``lines`` (each ``read`` as it is needed) through
    ``client``, at most ``max_concurrency`` at once; ``on_result(output line)`` in the input's
    order, each as soon as the lines before it are done."""
    numbered = enumerate(text for text in lines if text.strip())
    done: dict[int, dict] = {}  # answered, waiting for the lines before them
    released = 0

    def release_ready() -> None:
        nonlocal released
        while released in done:
            on_result(done.pop(released))
            released += 1

    async def worker() -> None:
        for index, text in numbered:  # shared: each worker takes the next line
            done[index] = await _answered(client, read(text))
            release_ready()

    await asyncio.gather(*(worker() for _ in range(max_concurrency)))


async def run_batch(
    app: Litestar,
    lines: Iterable[str],
    out: TextIO,
    max_concurrency: int = 256,
    on_done: Callable[[int], None] | None = None,
    listen: tuple[str, int] | None = None,
) -> BatchSummary:
    """Answer every non-blank line of ``lines`` (read as they are needed) through ``app``
    (started and stopped here) and write the output lines to ``out``; ``on_done(count)`` after
    each line is written; ``listen``: also serve the app on that host and port meanwhile."""
    counts = {"succeeded": 0, "failed": 0, "not_sent": 0}

    def write(result: dict) -> None:
        out.write(json.dumps(result) + "\n")
        counts[outcome(result)] += 1
        if on_done is not None:
            on_done(sum(counts.values()))

    async with app.lifespan(), _listening(app, listen), in_process_client(app) as client:
        await answer_lines(client, lines, max_concurrency, write)
    out.flush()
    return BatchSummary(**counts)


@asynccontextmanager
async def _listening(app: Litestar, listen: tuple[str, int] | None) -> AsyncIterator[None]:
    """Serve ``app`` (started already: no lifespan of its own) on ``listen`` while in the block."""
    if listen is None:
        yield
        return
    host, port = listen
    config = uvicorn.Config(
        TelemetryMiddleware(app, access_log=False),
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
    )
    server = uvicorn.Server(config)
    # Bound here, so a taken port is this call's OSError (uvicorn would exit the process).
    listener = socket.create_server((host, port))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if not server.started:
        raise OSError(f"could not serve on {host}:{port}")
    try:
        yield
    finally:
        server.should_exit = True
        await serving


async def _answered(client: httpx.AsyncClient, line: BatchLine) -> dict:
    """The output line for one input line."""
    record = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id}
    if line.problem is not None:
        return record | {
            "response": None,
            "error": {"code": "invalid_request", "message": line.problem},
        }
    try:
        reply = await client.post(line.url, json=line.body)
        while reply.status_code == 429:  # the queue is full (interactive calls): wait, send again
            await asyncio.sleep(float(reply.headers.get("retry-after", 1)))
            reply = await client.post(line.url, json=line.body)
    except Exception as error:  # the app failed outside its error handling: this line only
        log.exception("batch line %r failed", line.custom_id)
        message = f"the request failed: {type(error).__name__}: {error}"
        return record | {"response": None, "error": {"code": "server_error", "message": message}}
    try:
        body = reply.json()
    except ValueError:
        body = reply.text
    response = {
        "status_code": reply.status_code,
        "request_id": reply.headers.get(REQUEST_ID_HEADER),
        "body": body,
    }
    return record | {"response": response, "error": None}
