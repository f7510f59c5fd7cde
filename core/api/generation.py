"""Fan one API call out into engine requests and merge their outputs back.

A completions call with several prompts, or ``n > 1``, becomes one engine request per choice
(ids ``{id}-{i}``; ``seed + i`` when seeded). The group is *started* before the HTTP response
begins, so a request the engine rejects (e.g. prompt + max_tokens over the context) still gets
a proper 400 instead of a broken stream.

The engine sends each choice's outputs as deltas (what it gained since the previous output), so
that no step costs the length of the text so far; a whole answer is accumulated once.
"""

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from litestar import Request

from spyglass.core.api.errors import APIError
from spyglass.core.engine.engine_client import EngineClient
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.outputs import RequestOutput, joined
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams


@dataclasses.dataclass(frozen=True, slots=True)
class ChoiceSpec:
    """One engine request of a group: its prompt (and a vision model's prompt's images) and
    sampling params."""

    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    images: tuple[ImageInput, ...] = ()


def fan_out(
    prompts: list[tuple[list[int], str | None]],
    params: SamplingParams,
    images: tuple[ImageInput, ...] = (),
) -> list[ChoiceSpec]:
    """``n`` choices per prompt, choice ``i`` seeded with ``seed + i`` so choices differ yet
    reproduce; ``images`` are a single prompt's."""
    specs = []
    for token_ids, text in prompts:
        for index in range(params.n):
            seed = None if params.seed is None else params.seed + index
            choice = dataclasses.replace(params, n=1, seed=seed)
            specs.append(ChoiceSpec(token_ids, choice, text, images))
    return specs


def output_kind(stream: bool, reads_deltas: bool = False) -> RequestOutputKind:
    """The outputs a call's engine requests send: every delta for a streamed call, or for one
    that reads its deltas as they come (a reasoning split counts the tokens before the answer);
    else the first and the final one (`RequestOutputKind.FIRST_AND_FINAL`)."""
    if stream or reads_deltas:
        return RequestOutputKind.DELTA
    return RequestOutputKind.FIRST_AND_FINAL


class RequestGroup:
    """The engine requests behind one API call; iterate `outputs` to get ``(choice_index, delta)``
    pairs. ``kind`` is a delta kind (`output_kind`)."""

    def __init__(
        self,
        async_engine: EngineClient,
        base_id: str,
        specs: list[ChoiceSpec],
        attributes: dict,
        lora_name: str | None = None,
        kind: RequestOutputKind = RequestOutputKind.DELTA,
    ):
        self.req_ids = (
            [base_id] if len(specs) == 1 else [f"{base_id}-{i}" for i in range(len(specs))]
        )
        received = attributes.get("received_at")
        attributes = {key: value for key, value in attributes.items() if key != "received_at"}
        attributes["num_choices"] = len(specs)  # the metrics plugin's per-call histograms
        if received is not None:
            # The call's handling before the engine: reading the body, rendering the template,
            # tokenizing, fetching, decoding and resizing images.
            attributes["preprocess_seconds"] = time.perf_counter() - received
        self._streams = [
            async_engine.generate(
                req_id,
                spec.prompt_token_ids,
                dataclasses.replace(spec.params, output_kind=kind),
                spec.prompt,
                attributes,
                lora_name,
                spec.images,
            )
            for req_id, spec in zip(self.req_ids, specs)
        ]
        self.latest: list[RequestOutput] = []
        """Each choice's last delta (its prompt, cached tokens and finish reason), from `start` on."""
        self.num_tokens = [0] * len(specs)
        """How many tokens of each choice `outputs` has yielded."""
        self._pending: dict[asyncio.Future, int] = {}
        self._first: list[RequestOutput] = []

    async def start(self) -> None:
        """Submit every request and wait for each one's first output; raises what the engine raised."""
        try:
            results = await asyncio.gather(
                *(anext(s) for s in self._streams), return_exceptions=True
            )
        except asyncio.CancelledError:
            await self.aclose()
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.aclose()
            raise errors[0]
        self._first = list(results)
        self.latest = list(results)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every delta of every request, in arrival order, tagged with its choice index."""
        if len(self._streams) == 1:  # one choice (nearly every call): no task per output to merge
            try:
                (first,) = self._first
                yield 0, self._count(0, first)
                if not first.finished:
                    async for output in self._streams[0]:
                        yield 0, self._count(0, output)
            finally:
                await self.aclose()
            return
        try:
            for index, output in enumerate(self._first):
                yield index, self._count(index, output)
                if not output.finished:
                    self._pending[asyncio.ensure_future(anext(self._streams[index]))] = index
            while self._pending:
                done, _ = await asyncio.wait(self._pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = self._pending.pop(task)
                    output = task.result()
                    yield index, self._count(index, output)
                    if not output.finished:
                        self._pending[asyncio.ensure_future(anext(self._streams[index]))] = index
        finally:
            await self.aclose()

    def _count(self, index: int, output: RequestOutput) -> RequestOutput:
        self.latest[index] = output
        self.num_tokens[index] += len(output.outputs[0].token_ids)
        return output

    async def final_outputs(
        self, on_delta: Callable[[int, RequestOutput], object] | None = None
    ) -> list[RequestOutput]:
        """Run every choice to the end; the whole output of each, in choice order. ``on_delta``
        sees each delta as it comes (choice index, output)."""
        deltas: dict[int, list[RequestOutput]] = {}
        async for index, output in self.outputs():
            deltas.setdefault(index, []).append(output)
            if on_delta is not None:
                on_delta(index, output)
        return [joined(deltas[i]) for i in sorted(deltas)]

    async def aclose(self) -> None:
        """Stop listening; engine requests still running are aborted."""
        pending, self._pending = list(self._pending), {}
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in self._streams:
            await stream.aclose()


T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    """Return once the client has gone: after the body, the next ASGI message is ``http.disconnect``."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (which aborts its engine requests) as soon as the client disconnects.

    Streams get this from Litestar; a non-streamed call would otherwise compute on for nobody.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise APIError(499, "the client closed the connection", code="client_disconnected")
    return task.result()
