"""The benchmark workloads, generated from a seed so every run and every engine sees the same requests."""

from dataclasses import dataclass

import numpy as np

FIRST_ORDINARY_TOKEN = 100
"""Random prompts stay clear of the special tokens at the start of typical vocabularies."""


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """A prompt as token ids and how many tokens to generate (with ``ignore_eos``)."""

    prompt_token_ids: list[int]
    output_len: int


def _random_prompt(rng: np.random.Generator, length: int, vocab_size: int) -> list[int]:
    return rng.integers(FIRST_ORDINARY_TOKEN, vocab_size, size=length).tolist()


def w1_workload(
    vocab_size: int,
    num_requests: int = 64,
    prompt_len: int = 128,
    output_len: int = 128,
    seed: int = 1,
):
    """W1: uniform requests, 128-token prompts and 128 output tokens."""
    rng = np.random.default_rng(seed)
    return [
        BenchRequest(_random_prompt(rng, prompt_len, vocab_size), output_len)
        for _ in range(num_requests)
    ]


def w3_workload(vocab_size: int, num_requests: int = 256, seed: int = 3) -> list[BenchRequest]:
    """W3: long-tailed lengths, prompts 16..1024 and outputs 8..512 tokens (log-normal, clipped)."""
    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(rng.lognormal(mean=5.0, sigma=0.8, size=num_requests), 16, 1024).astype(
        int
    )
    output_lens = np.clip(rng.lognormal(mean=4.3, sigma=0.9, size=num_requests), 8, 512).astype(int)
    return [
        BenchRequest(_random_prompt(rng, int(p), vocab_size), int(o))
        for p, o in zip(prompt_lens, output_lens)
    ]


WORKLOADS = {"w1": w1_workload, "w3": w3_workload}
