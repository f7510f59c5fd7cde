"""OpenAI's Batch API, served online (as SGLang serves it): ``POST /v1/batches`` answers every line
of an uploaded batch file (`files`) in the background, through the same routes, checks and engine
as the lines ``spyglass run-batch`` reads offline (`batch_file`); ``GET`` reads where a batch
stands (``request_counts``), ``POST .../cancel`` stops it, ``GET /v1/batches`` lists them. When
it ends, the answers (2xx) are its output file and the rest its error file, in input order.

A batch's calls carry ``x-spyglass-batch-id``, so their spans say which batch they belong to;
``spyglass:batches_running`` counts the batches being answered. A stopping server cancels them.
"""

import asyncio
import json
from typing import Annotated, Literal

import msgspec
from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter

from spyglass.core.api.batch_file import (
    BatchLine,
    answer_lines,
    in_process_client,
    outcome,
    read_line,
)
from spyglass.core.api.batch_records import BATCH_ID_HEADER, BatchRun, StoredFile
from spyglass.core.api.context import ServingContext
from spyglass.core.api.cursor_pages import CursorPage, page_of
from spyglass.core.api.errors import APIError
from spyglass.core.api.schemas import Metadata
from spyglass.core.api.validation import json_body_guard
from spyglass.telemetry import metrics

BATCH_CONCURRENCY = 64
"""A batch's calls in flight at once: enough to fill a batch of the engine's, while the waiting
queue keeps room for interactive calls."""
Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]


class BatchCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/batches``: the uploaded input file, the endpoint all its lines call, and the
    completion window (``24h``, the only one OpenAI offers)."""

    input_file_id: Annotated[str, msgspec.Meta(max_length=256)]
    endpoint: Endpoint
    completion_window: Literal["24h"]
    metadata: Metadata | None = None


@post(
    "/v1/batches",
    summary="Create a batch (OpenAI Batch API)",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": BatchCreate},
)
async def create_batch(
    data: JSONBody[BatchCreate], request: Request, serving: NamedDependency[ServingContext]
) -> dict:
    """Start answering the input file's lines in the background: the batch ``in_progress``."""
    source = serving.files.require(data.input_file_id, "input_file_id")
    try:
        lines = [line for line in source.content.decode().splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise APIError(400, "the input file is not UTF-8 text", "input_file_id") from None
    if not lines:
        raise APIError(400, "the input file has no lines", "input_file_id")
    run = BatchRun(data.endpoint, source.id, len(lines), dict(data.metadata or {}))
    run.enter("in_progress")
    serving.batches.put(run.id, run)
    run.task = asyncio.create_task(_answer(run, lines, request.app, serving))
    return run.card()


@get("/v1/batches/{batch_id:str}", summary="A batch (OpenAI Batch API)", tags=["openai"])
async def retrieve_batch(batch_id: FromPath[str], serving: NamedDependency[ServingContext]) -> dict:
    """Where the batch stands: its status, ``request_counts`` so far, and its files once done."""
    return serving.batches.require(batch_id, "batch_id").card()


@post(
    "/v1/batches/{batch_id:str}/cancel",
    summary="Cancel a batch (OpenAI Batch API)",
    tags=["openai"],
    status_code=200,
)
async def cancel_batch(batch_id: FromPath[str], serving: NamedDependency[ServingContext]) -> dict:
    """Stop the batch: its calls in flight are aborted, the lines answered so far kept in its
    files; ``cancelled``. A batch that ended already is returned as it is."""
    run = serving.batches.require(batch_id, "batch_id")
    await _stop(run)
    return run.card()


@get("/v1/batches", summary="Batches (OpenAI Batch API)", tags=["openai"])
async def list_batches(
    serving: NamedDependency[ServingContext],
    limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
    after: Annotated[str | None, QueryParameter(max_length=256)] = None,
) -> dict:
    """The kept batches, newest first, paged."""
    runs = serving.batches.entries()
    page = CursorPage("desc", limit, after)
    return page_of(runs, page, lambda run: run.id, BatchRun.card, "batch {!r} among those listed")


async def close_batches(serving: ServingContext) -> None:
    """Cancel every batch still running (the server is stopping)."""
    await asyncio.gather(*(_stop(run) for run in list(serving.running_batches)))


async def _stop(run: BatchRun) -> None:
    if run.task is not None and not run.task.done():
        run.enter("cancelling")
        run.task.cancel()
        await asyncio.wait({run.task})


async def _answer(run: BatchRun, lines: list[str], app, serving: ServingContext) -> None:
    """Answer the lines through the app in this process, counting them as they end; then write
    the output and error files, however the batch ended."""
    answered: dict[str, list[str]] = {"output": [], "error": []}

    def keep(result: dict) -> None:
        succeeded = outcome(result) == "succeeded"
        answered["output" if succeeded else "error"].append(json.dumps(result))
        run.completed += succeeded
        run.failed += not succeeded

    def read(text: str) -> BatchLine:
        line = read_line(text)
        if line.problem is None and line.url != run.endpoint:
            message = f"the line's url {line.url!r} is not the batch's endpoint {run.endpoint!r}"
            return BatchLine(line.custom_id, problem=message)
        return line

    metrics.BATCHES_RUNNING.inc()
    serving.running_batches.add(run)
    ended = "completed"
    try:
        async with in_process_client(app, {BATCH_ID_HEADER: run.id}) as client:
            await answer_lines(client, lines, BATCH_CONCURRENCY, keep, read)
    except asyncio.CancelledError:
        ended = "cancelled"
    finally:
        metrics.BATCHES_RUNNING.dec()
        serving.running_batches.discard(run)
        if ended == "completed":
            run.enter("finalizing")
        for kind, results in answered.items():
            if results:
                written = StoredFile(f"{run.id}_{kind}.jsonl", "batch_output", _jsonl(results))
                serving.files.put(written.id, written)
                setattr(run, f"{kind}_file_id", written.id)
        run.enter(ended)


def _jsonl(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()
