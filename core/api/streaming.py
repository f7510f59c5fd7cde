"""Server-sent events: ``data: {json}`` per chunk, an error event if generation fails, then ``data: [DONE]``
(OpenAI's framing); or named events, ``event: NAME`` before each ``data:`` line and no ``[DONE]`` (Anthropic's)."""

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


def named_sse_event(name: str, payload) -> bytes:
    """One ``event: name`` + ``data:`` event."""
    return f"event: {name}\n".encode() + sse_event(payload)


async def _events(chunks: AsyncGenerator, named: bool) -> AsyncIterator[bytes]:
    # Closing `chunks` in `finally` is what aborts the engine requests when the client goes away:
    # Litestar cancels the stream on disconnect, and this generator is closed with it.
    frame = (lambda item: named_sse_event(*item)) if named else sse_event
    try:
        async for chunk in chunks:
            yield frame(chunk)
    except APIError as error:
        yield frame(
            ("error", error_body(error.status_code, error.message, error.param, error.code))
            if named
            else error_body(error.status_code, error.message, error.param, error.code)
        )
    except Exception as error:
        log.exception("streamed generation failed")
        body = error_body(
            500, f"generation failed: {type(error).__name__}: {error}", code="engine_error"
        )
        yield frame(("error", body) if named else body)
    finally:
        # Shielded: on disconnect the surrounding cancel scope would interrupt the cleanup itself.
        with anyio.CancelScope(shield=True):
            await chunks.aclose()
    if not named:
        yield DONE


def event_stream(chunks: AsyncGenerator, named: bool = False) -> Stream:
    """A ``text/event-stream`` response framing ``chunks`` as SSE: response Structs, or ``(event name, payload)``
    pairs when ``named``."""
    return Stream(
        _events(chunks, named),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
