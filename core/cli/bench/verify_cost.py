"""``bench latency --verify-cost``: what a step verifying L drafts costs, in plain decode steps.

A plugin object answers the engine's own proposer method ahead of its proposer (pluggy calls the
last registered first) with L copies of one token for every decoding request; the bench times the
engine's steps while one greedy request decodes, for L = 0 (no drafts) to K, interleaved over the
rounds. Whether drafts are accepted does not change the work: L + 1 rows go through every layer.
"""

import statistics
import time

from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.sampling_params import SamplingParams


class FixedDrafts:
    """Proposes ``length`` copies of ``token_id`` for every request, for the proposer ``method``."""

    def __init__(self, method: str, token_id: int):
        self.method = method
        self.token_id = token_id
        self.length = 0

    @hookimpl
    def spyglass_propose_drafts(self, method, requests, num_speculative_tokens):
        """The fixed drafts, in place of ``method``'s own proposer."""
        if method != self.method:
            return None
        return {r.req_id: [self.token_id] * self.length for r in requests}


def _median_step_seconds(engine: LLMEngine, token_ids: list[int], steps: int) -> float:
    engine.add_request(
        f"verify-cost-{time.monotonic_ns()}",
        token_ids,
        SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True),
    )
    engine.step()  # the prompt
    seconds = []
    while engine.has_unfinished_requests:
        start = time.perf_counter()
        engine.step()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def verification_costs(
    engine: LLMEngine, token_ids: list[int], max_drafts: int, rounds: int, steps: int = 24
) -> dict[int, float]:
    """Median seconds of a step verifying L drafts for one request, L = 0 .. ``max_drafts``."""
    drafts = FixedDrafts(engine.config.speculative, token_id=token_ids[-1])
    samples = {length: [] for length in range(max_drafts + 1)}
    engine.plugin_manager.register(drafts)
    try:
        for _ in range(rounds):
            for length in samples:
                drafts.length = length
                samples[length].append(_median_step_seconds(engine, token_ids, steps))
    finally:
        engine.plugin_manager.unregister(drafts)
    return {length: statistics.median(values) for length, values in samples.items()}


def print_costs(costs: dict[int, float]) -> None:
    """The table: ms per step and the cost in plain decode steps, by number of drafts."""
    print("verifying L drafts at batch 1: ms per step, and in plain decode steps")
    print(f"{'drafts':<8}{'ms/step':>9}{'x plain':>9}")
    for length, seconds in costs.items():
        print(f"{length:<8}{seconds * 1e3:>9.1f}{seconds / costs[0]:>8.2f}x")
