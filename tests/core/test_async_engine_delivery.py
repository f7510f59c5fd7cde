"""The asyncio front delivers a step's outputs in one wake-up per event loop and lets a listener
that fell behind skip to the newest (cumulative) output."""

import asyncio

from spyglass.core.engine.async_engine import AsyncEngine
from spyglass.core.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _listen(front: AsyncEngine, req_id: str, lag_after_first: float) -> list:
    async def listen():
        outputs = []
        async for output in front.generate(req_id, [1, 2, 3, 4], PARAMS):
            outputs.append(output)
            if len(outputs) == 1:
                await asyncio.sleep(lag_after_first)  # the engine runs on meanwhile
        return outputs

    return asyncio.run(listen())


def test_a_listener_that_falls_behind_gets_the_newest_output_not_every_one(make_tiny_engine):
    front = AsyncEngine(make_tiny_engine())
    front.start()
    try:
        prompt_pace = _listen(front, "keeping-up", 0.0)
        lagging = _listen(front, "lagging", 1.0)
    finally:
        front.stop()
    assert lagging[-1].finished and prompt_pace[-1].finished
    # Nothing is lost: the last output holds every token, the same as a listener that kept up.
    assert lagging[-1].outputs[0].token_ids == prompt_pace[-1].outputs[0].token_ids
    assert len(lagging[-1].outputs[0].token_ids) == 24
    # 24 steps ran during the second listener's pause: it got their newest output at once.
    assert len(lagging) < len(prompt_pace) and len(lagging) <= 3
