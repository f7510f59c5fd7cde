"""GPU only: default-model parity with CUDA graphs on and off, and no capture or recompilation while serving."""

import pytest
import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.runner.cuda_graphs import GraphShape, batch_buckets
from spyglass.core.engine.sampling_params import SamplingParams
from tests.kernels.mixed_workload import random_prompts, serve_rounds

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


def _compiled_variants() -> dict[str, int]:
    """How many variants of each Triton kernel are compiled so far, by kernel name."""
    from spyglass.kernels import triton_attention, triton_moe, triton_norm_rope, triton_store_kv

    kernels = [
        triton_attention._unified_kernel,
        triton_attention._split_k_kernel,
        triton_store_kv._store_kv_kernel,
        triton_norm_rope._add_rms_norm_kernel,
        triton_norm_rope._rotary_kernel,
        triton_moe._gate_up_kernel,
        triton_moe._down_kernel,
    ]
    # Triton keeps, per device, a tuple whose first item maps specialisations to compiled kernels.
    return {
        kernel.fn.__name__: sum(
            len(c[0] if isinstance(c, tuple) else c)
            for c in getattr(kernel, "device_caches", {}).values()
        )
        for kernel in kernels
    }


def test_graphs_on_and_off_give_the_same_tokens_and_serving_captures_nothing():
    eager = LLMEngine(EngineConfig(dtype="float32", cuda_graphs=False))
    graphs = LLMEngine(EngineConfig(dtype="float32", cuda_graphs=True, max_num_seqs=64))
    assert graphs.runner.graphs is not None
    assert _greedy(eager, PROMPTS, "a") == _greedy(graphs, PROMPTS, "a")
    captured = dict(graphs.runner.graphs.graphs)
    compiled = _compiled_variants()
    _greedy(graphs, PROMPTS * 3, "b")
    assert graphs.runner.graphs.graphs == captured
    assert _compiled_variants() == compiled


def test_serving_a_mixed_workload_compiles_nothing_after_start():
    """Prompt lengths from 1 to 1,500 tokens, repeats (prefix-cache hits), batches of 1 to 80
    (beyond the largest graph), long contexts at batch 1 (split-K) and n-gram drafts to verify."""
    engine = LLMEngine(
        EngineConfig(cuda_graphs=True, max_num_seqs=64, speculative="ngram", max_model_len=4096)
    )
    compiled = _compiled_variants()
    prompt = random_prompts(20000)
    rounds = [
        [prompt(n) for n in (1, 2, 3, 5, 9, 17, 33, 65, 129, 300)],
        [prompt(1500)],  # alone: a long context at batch 1
        [prompt(40) for _ in range(80)],
    ]
    serve_rounds(engine, rounds, max_tokens=24)
    assert _compiled_variants() == compiled


def test_verify_steps_replay_graphs_and_give_the_same_tokens():
    """Decode steps with n-gram drafts to verify run from graphs of 1 + 4 rows per request."""
    options = {"dtype": "float32", "speculative": "ngram", "max_num_seqs": 16}
    eager = LLMEngine(EngineConfig(cuda_graphs=False, **options))
    graphs = LLMEngine(EngineConfig(cuda_graphs=True, **options))
    decoder = graphs.runner.graphs
    assert GraphShape(16, 5, 80) in decoder.graphs
    replayed = []
    replay = decoder._replay
    decoder._replay = lambda shape: (replayed.append(shape), replay(shape))[1]
    # Counting and copying prompts: the n-gram proposer finds drafts in them.
    prompts = [", ".join(str(n % 7) for n in range(40)), PROMPTS[1] * 3, *PROMPTS]
    assert _greedy(eager, prompts, "a") == _greedy(graphs, prompts, "a")
    assert any(shape.rows == 5 for shape in replayed)
    graphs.kv.check_integrity()


def test_packed_graphs_replay_prompt_chunks_among_decodes_and_compile_nothing():
    """A 64-token budget: prompts are cut into chunks that share steps with the decodes of the
    requests before them, replayed from packed graphs of 32 and 64 tokens."""
    options = {"dtype": "float32", "max_num_seqs": 16, "max_num_batched_tokens": 64}
    eager = LLMEngine(EngineConfig(cuda_graphs=False, **options))
    graphs = LLMEngine(EngineConfig(cuda_graphs=True, cuda_graph_tokens=64, **options))
    decoder = graphs.runner.graphs
    assert {GraphShape(16, 0, 32), GraphShape(16, 0, 64)} <= set(decoder.graphs)
    compiled = _compiled_variants()
    replayed = []
    replay = decoder._replay
    decoder._replay = lambda shape: (replayed.append(shape), replay(shape))[1]
    prompt = random_prompts(20000)
    prompts = [prompt(n) for n in (3, 40, 9, 100, 17, 65, 1, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    tokens = []
    for engine in (eager, graphs):
        for index, token_ids in enumerate(prompts):
            engine.add_request(str(index), token_ids, params)
        done = {}
        while engine.has_unfinished_requests:
            for output in engine.step():
                if output.finished:
                    done[output.request_id] = output.outputs[0].token_ids
        tokens.append(done)
    assert tokens[0] == tokens[1]
    assert any(shape.rows == 0 for shape in replayed)
    assert _compiled_variants() == compiled
    graphs.kv.check_integrity()
