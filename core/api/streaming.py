"""Server-sent events: ``data: {json}`` per chunk, an error event if generation fails, then ``data: [DONE]``."""

import logging
from collections.abc import AsyncGenerator, AsyncIterator

import anyio
import msgspec
from litestar.response import Stream

from spyglass.core.api.errors import APIError, error_body

log = logging.getLogger("spyglass.api")

DONE = b"data: [DONE]\n\n"


def sse_event(payload) -> bytes:
    """One ``data:`` event holding ``payload`` (a Struct or a dict) as JSON."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


async def _events(chunks: AsyncGenerator) -> AsyncIterator[bytes]:
    # Closing `chunks` in `finally` is what aborts the engine requests when the client goes away:
    # Litestar cancels the stream on disconnect, and this generator is closed with it.
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    except APIError as error:
        yield sse_event(error_body(error.status_code, error.message, error.param, error.code))
    except Exception as error:
        log.exception("streamed generation failed")
        yield sse_event(error_body(500, f"generation failed: {type(error).__name__}: {error}", code="engine_error"))
    finally:
        # Shielded: on disconnect the surrounding cancel scope would interrupt the cleanup itself.
        with anyio.CancelScope(shield=True):
            await chunks.aclose()
    yield DONE


def event_stream(chunks: AsyncGenerator) -> Stream:
    """A ``text/event-stream`` response that frames ``chunks`` (response Structs) as SSE."""
    return Stream(
        _events(chunks),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
