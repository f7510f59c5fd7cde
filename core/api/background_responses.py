"""Responses API calls run in the background (``background: true``).

The call returns as soon as its request has started, with the response ``in_progress``; the
answer is generated whether or not the client stays connected, and the finished response is
kept in the store (`response_store`) like any other. Until then ``GET /v1/responses/{id}``
reads the response so far from here, and ``POST /v1/responses/{id}/cancel`` stops it (its engine
request is aborted, its blocks freed; the response is kept as ``cancelled`` with the output it
had). A run that fails is kept as ``failed`` with the reason. When the server stops, the runs
its engine could not finish are cancelled. How many run now is
``spyglass:responses_in_background``.
"""

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

from spyglass.telemetry import metrics


@dataclass(frozen=True, slots=True)
class BackgroundRun:
    """One response being generated in the background: its task, and how to read it so far."""

    task: asyncio.Task
    snapshot: Callable[[], dict]


class BackgroundResponses:
    """The responses being generated in the background now, by id."""

    def __init__(self):
        self._runs: dict[str, BackgroundRun] = {}

    def start(self, response_id: str, work: Coroutine, snapshot: Callable[[], dict]) -> None:
        """Run ``work`` (which keeps the finished response) in a task of its own, readable by
        ``snapshot`` until it ends."""
        task = asyncio.get_running_loop().create_task(work, name=f"background {response_id}")
        self._runs[response_id] = BackgroundRun(task, snapshot)
        task.add_done_callback(lambda _: self._ended(response_id))
        metrics.RESPONSES_IN_BACKGROUND.set(len(self._runs))

    def _ended(self, response_id: str) -> None:
        self._runs.pop(response_id, None)
        metrics.RESPONSES_IN_BACKGROUND.set(len(self._runs))

    def snapshot(self, response_id: str) -> dict | None:
        """The response ``response_id`` so far, while it runs; None when it does not (any more)."""
        run = self._runs.get(response_id)
        return None if run is None else run.snapshot()

    async def cancel(self, response_id: str) -> bool:
        """Stop the run ``response_id`` and wait until its response is kept; whether it ran."""
        run = self._runs.get(response_id)
        if run is None:
            return False
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        return True

    async def close(self) -> None:
        """Cancel every run still going (the server is stopping)."""
        for response_id in list(self._runs):
            await self.cancel(response_id)
