"""GPU only: default-model parity with CUDA graphs on and off, and no capture or recompilation while serving."""

import pytest
import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.runner.cuda_graphs import batch_buckets
from spyglass.core.engine.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "用一句话介绍长城。",
    "List three colours:",
]


def test_buckets_cover_every_batch_size():
    assert batch_buckets(1) == [1]
    assert batch_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert all(any(b >= n for b in batch_buckets(128)) for n in range(1, 129))


def _greedy(engine: LLMEngine, prompts, tag: str) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"{tag}{index}", engine.tokenizer.encode(prompt), params)
    done = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                done[output.request_id] = output.outputs[0].token_ids
    return [done[f"{tag}{i}"] for i in range(len(prompts))]


def _triton_cache_sizes() -> int:
    from spyglass.kernels import triton_attention, triton_store_kv

    kernels = [
        triton_attention._unified_kernel,
        triton_attention._split_k_kernel,
        triton_store_kv._store_kv_kernel,
    ]
    # Triton keeps, per device, a tuple whose first item maps specialisations to compiled kernels.
    caches = [c for k in kernels for c in getattr(k, "device_caches", {}).values()]
    return sum(len(c[0] if isinstance(c, tuple) else c) for c in caches)


def test_graphs_on_and_off_give_the_same_tokens_and_serving_captures_nothing():
    eager = LLMEngine(EngineConfig(dtype="float32", cuda_graphs=False))
    graphs = LLMEngine(EngineConfig(dtype="float32", cuda_graphs=True, max_num_seqs=64))
    assert graphs.runner.graphs is not None
    assert _greedy(eager, PROMPTS, "a") == _greedy(graphs, PROMPTS, "a")
    captured = dict(graphs.runner.graphs.graphs)
    compiled = _triton_cache_sizes()
    _greedy(graphs, PROMPTS * 3, "b")
    assert graphs.runner.graphs.graphs == captured
    assert _triton_cache_sizes() == compiled
