"""The mixed workload that the no-recompilation tests serve, on a GPU and under the interpreter."""

from collections.abc import Callable

import torch

from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams


def random_prompts(high: int) -> Callable[[int], list[int]]:
    """A maker of seeded random prompts of a given length, token ids in 100..``high``."""
    generator = torch.Generator().manual_seed(0)
    return lambda length: torch.randint(100, high, (length,), generator=generator).tolist()


def serve_rounds(engine: LLMEngine, rounds: list[list[list[int]]], max_tokens: int) -> None:
    """Serve each round of prompts to its end (greedy, ``max_tokens`` each), then the first round's
    first four prompts twice over: cached prefixes, short remaining queries."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for index, batch in enumerate([*rounds, rounds[0][:4] * 2]):
        for number, token_ids in enumerate(batch):
            engine.add_request(f"r{index}-{number}", token_ids, params)
        while engine.has_unfinished_requests:
            engine.step()
