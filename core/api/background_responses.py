"""Responses API calls run in the background (``background: true``).

The call returns as soon as its request has started: with the response ``in_progress``, or with
``stream`` the run's events as they come. The answer is generated whether or not the client
stays connected, and the finished response is kept in the store (`response_store`) like any
other. Until then ``GET /v1/responses/{id}`` reads the response so far from here (with
``stream=true`` it follows the run's events, from ``starting_after`` on, as a client that lost
its stream resumes it), and ``POST /v1/responses/{id}/cancel`` stops it (its engine request is
aborted, its blocks freed; the response is kept as ``cancelled`` with the output it had). A run
that fails is kept as ``failed`` with the reason. When the server stops, the runs its engine
could not finish are cancelled. How many run now is ``spyglass:responses_in_background``.
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine

from spyglass.telemetry import metrics

Event = tuple[str, dict]
"""A named stream event: its name and its payload (with its ``sequence_number``)."""


class BackgroundRun:
    """One response being generated in the background: its task, its events so far, and how to
    read the response so far."""

    def __init__(self, snapshot: Callable[[], dict]):
        self.snapshot = snapshot
        self.events: list[Event] = []
        """Every event of the run, by sequence number (kept while it runs)."""
        self.task: asyncio.Task | None = None
        self._changed = asyncio.Event()

    def record(self, event: Event) -> None:
        """Add the run's next event, waking the streams that follow it."""
        self.events.append(event)
        self.wake()

    def wake(self) -> None:
        """Wake the streams that follow the run (an event came, or it ended)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def follow(self, starting_after: int = -1) -> AsyncIterator[Event]:
        """The run's events after the one numbered ``starting_after``, as they come, until it ends."""
        index = starting_after + 1
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.task.done():
                return
            await self._changed.wait()


class BackgroundResponses:
    """The responses being generated in the background now, by id."""

    def __init__(self):
        self._runs: dict[str, BackgroundRun] = {}

    def start(
        self,
        response_id: str,
        work: Callable[[Callable[[Event], None]], Coroutine],
        snapshot: Callable[[], dict],
    ) -> BackgroundRun:
        """Run ``work(record)`` (which records the run's events and keeps the finished response)
        in a task of its own, readable by ``snapshot`` until it ends."""
        run = BackgroundRun(snapshot)
        run.task = asyncio.get_running_loop().create_task(
            work(run.record), name=f"background {response_id}"
        )
        self._runs[response_id] = run
        run.task.add_done_callback(lambda _: self._ended(response_id, run))
        metrics.RESPONSES_IN_BACKGROUND.set(len(self._runs))
        return run

    def _ended(self, response_id: str, run: BackgroundRun) -> None:
        self._runs.pop(response_id, None)
        run.wake()  # streams still following see that it ended
        metrics.RESPONSES_IN_BACKGROUND.set(len(self._runs))

    def get(self, response_id: str) -> BackgroundRun | None:
        """The run ``response_id``, while it runs."""
        return self._runs.get(response_id)

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
