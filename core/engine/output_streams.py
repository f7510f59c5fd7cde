"""Per-request asyncio queues that a front fills from another thread, one wake-up per event loop per step."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from spyglass.core.engine.outputs import RequestOutput, joined
from spyglass.core.engine.sampling_params import RequestOutputKind


class OutputStreams:
    """The listeners of a front's requests: each request's outputs reach the event loop that asked for it."""

    def __init__(self) -> None:
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}

    async def listen(
        self,
        req_id: str,
        add: Callable[[], Future],
        abort: Callable[[str], None],
        kind: RequestOutputKind,
    ) -> AsyncIterator[RequestOutput]:
        """Register ``req_id``, call ``add()`` and yield its outputs until the finished one.

        ``add`` queues the request and returns a future that fails if the engine rejects it (that
        error is raised before anything is yielded). If the caller stops listening early,
        ``abort(req_id)`` is called. A listener that fell behind gets what it missed in one output
        (one chunk with several tokens instead of one per token): the newest cumulative output, or
        the waiting delta outputs merged (``kind`` is the request's output kind).
        """
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[req_id] = (asyncio.get_running_loop(), stream)
        finished = False
        try:
            await asyncio.wrap_future(add())
            while not finished:
                waiting = [await stream.get()]
                while not isinstance(waiting[-1], Exception) and not stream.empty():
                    waiting.append(stream.get_nowait())
                output = waiting[-1]
                if kind.is_delta and not isinstance(output, Exception):
                    output = joined(waiting)
                if isinstance(output, Exception):
                    raise output
                finished = output.finished
                yield output
        finally:
            self._streams.pop(req_id, None)
            if not finished:
                abort(req_id)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their listeners (any thread): one wake-up per event loop, not one per output."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for output in outputs:
            target = self._streams.get(output.request_id)
            if target is not None:
                batches.setdefault(target[0], []).append((target[1], output))
        for loop, items in batches.items():
            _put(loop, items)

    def fail_all(self, error: Exception) -> None:
        """Raise ``error`` in every listener."""
        for loop, stream in list(self._streams.values()):
            _put(loop, [(stream, error)])


def _put(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue, object]]) -> None:
    """Put each item in its queue, in ``loop``'s thread; a loop that has closed has no listener left."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for stream, item in items:
        stream.put_nowait(item)
