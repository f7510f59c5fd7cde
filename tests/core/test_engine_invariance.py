"""Greedy float32 outputs do not depend on how the engine batches, chunks, pages or preempts.

Every test runs on three tiny random models: Llama, Mistral with a 16-token sliding window (the longer
prompts and their continuations run past it), and Qwen2-MoE (routed and shared experts).
"""

from dataclasses import replace

import pytest
import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.runner.cuda_graphs import token_buckets
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.loaders.load import load_checkpoint

# logprobs=2 lets a mismatch be checked against the top-two gap (see assert_same_greedy).
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)


class StepRecorder:
    """A plugin that keeps every step's stats."""

    def __init__(self):
        self.steps = []

    @hookimpl
    def spyglass_step_finished(self, stats):
        """Keep the stats."""
        self.steps.append(stats)


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2-moe"])
def make_tiny_engine(request, make_tiny_engine, tiny_family_dir, tiny_engine_factory):
    """The engine factory of tests/core/conftest.py, or the same over another family's tiny checkpoint."""
    if request.param == "llama":
        return make_tiny_engine
    path = tiny_family_dir(request.param)
    return tiny_engine_factory(path, load_checkpoint(str(path), torch.float32))


@pytest.fixture(scope="module")
def prompts(tiny_llama_checkpoint, mixed_texts) -> list[list[int]]:
    # Every tiny model shares the default model's tokenizer.
    tokenizer = tiny_llama_checkpoint.tokenizer
    token_ids = [tokenizer.encode(text) for text in mixed_texts]
    assert min(map(len, token_ids)) <= 3 and max(map(len, token_ids)) >= 64
    return token_ids


@pytest.fixture(scope="module")
def reference(make_tiny_engine, run_engine, prompts):
    """All prompts in one batch with the defaults: block size 16, a budget that fits every prompt at once."""
    return run_engine(make_tiny_engine(), prompts, GREEDY)


def test_reference_is_sane(reference, prompts):
    for output, prompt in zip(reference, prompts):
        completion = output.outputs[0]
        assert output.prompt_token_ids == prompt
        assert len(completion.token_ids) == 16 and completion.finish_reason == "length"
        assert len(completion.logprobs) == 16
    # Different prompts lead somewhere different: the comparisons below are not trivially equal.
    assert len({tuple(o.outputs[0].token_ids) for o in reference}) == len(reference)


def test_alone_equals_batched(make_tiny_engine, run_engine, prompts, reference, same_greedy):
    # One engine, one prompt at a time: also checks that reused (dirty) blocks do not leak into a new request.
    engine = make_tiny_engine(num_kv_blocks=16)
    for prompt, expected in zip(prompts, reference):
        [alone] = run_engine(engine, [prompt], GREEDY)
        same_greedy(expected, alone)


def test_other_companions_and_order(make_tiny_engine, run_engine, prompts, reference, same_greedy):
    # Reversed order, and seeded sampled requests of other lengths riding along in the same batches.
    sampled = SamplingParams(temperature=1.0, seed=7, max_tokens=5, ignore_eos=True)
    companions = [prompt[: max(1, len(prompt) // 2)] for prompt in prompts[:4]]
    mixed = prompts[::-1] + companions
    params = [GREEDY] * len(prompts) + [sampled] * len(companions)
    outputs = run_engine(make_tiny_engine(), mixed, params)
    for expected, actual in zip(reference, outputs[: len(prompts)][::-1]):
        same_greedy(expected, actual)


def test_staggered_arrivals(make_tiny_engine, prompts, reference, same_greedy):
    # A new request every other step: prefills land in batches full of decodes at every stage.
    engine = make_tiny_engine()
    pending = list(enumerate(prompts))
    finished = {}
    while pending or engine.has_unfinished_requests:
        if pending:
            index, prompt = pending.pop(0)
            engine.add_request(f"late-{index}", prompt, GREEDY)
        for _ in range(2):
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
            engine.kv.check_integrity()
    for index, expected in enumerate(reference):
        same_greedy(expected, finished[f"late-{index}"])


@pytest.mark.parametrize("max_num_batched_tokens", [32, 64])
def test_chunked_prefill_mixed_with_decodes(
    make_tiny_engine, run_engine, prompts, reference, same_greedy, max_num_batched_tokens
):
    engine = make_tiny_engine(max_num_batched_tokens=max_num_batched_tokens)
    recorder = StepRecorder()
    engine.plugin_manager.register(recorder)
    outputs = run_engine(engine, prompts, GREEDY)
    assert max(map(len, prompts)) > max_num_batched_tokens  # so at least one prompt is chunked
    assert all(s.num_scheduled_tokens <= max_num_batched_tokens for s in recorder.steps)
    assert any(s.num_prefill_reqs and s.num_decode_reqs for s in recorder.steps), (
        "no step mixed prefill and decode"
    )
    for expected, actual in zip(reference, outputs):
        same_greedy(expected, actual)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_block_size(make_tiny_engine, run_engine, prompts, reference, same_greedy, block_size):
    engine = make_tiny_engine(block_size=block_size, num_kv_blocks=4096 // block_size)
    for expected, actual in zip(reference, run_engine(engine, prompts, GREEDY)):
        same_greedy(expected, actual)


def test_forced_preemption(
    make_tiny_engine, run_engine, count_preemptions, prompts, reference, same_greedy
):
    # 20 blocks of 8 = 160 token slots for ~450 tokens of work: requests must lose their blocks and recompute.
    engine = make_tiny_engine(block_size=8, num_kv_blocks=20, max_num_batched_tokens=64)
    if engine.kv.sliding_window is not None:
        # Mistral gives back the blocks that leave its window, so forcing preemption takes less room.
        engine = make_tiny_engine(block_size=8, num_kv_blocks=12, max_num_batched_tokens=32)
    preemptions = count_preemptions(engine)
    outputs = run_engine(engine, prompts, GREEDY)
    assert len(preemptions.req_ids) >= 3
    assert sum(1 for o in outputs if o.request_id in preemptions.req_ids) >= 2
    for expected, actual in zip(reference, outputs):
        same_greedy(expected, actual)


def test_prefix_cache_hits(make_tiny_engine, run_engine, prompts, reference, same_greedy):
    # With the prefix-cache plugin a second pass over the same prompts reuses their full blocks,
    # and a prompt extending a cached one reuses its leading blocks; outputs stay the same.
    engine = make_tiny_engine(plugins=["fcfs", "prefix_cache"], block_size=8)
    first = run_engine(engine, prompts, GREEDY)
    second = run_engine(engine, prompts, GREEDY)
    assert all(o.num_cached_tokens == 0 for o in first)
    assert [o.num_cached_tokens for o in second] == [(len(p) - 1) // 8 * 8 for p in prompts]
    for expected, a, b in zip(reference, first, second):
        same_greedy(expected, a)
        same_greedy(expected, b)
    extended = prompts[4] + prompts[1]
    [alone] = run_engine(make_tiny_engine(block_size=8), [extended], GREEDY)
    [hit] = run_engine(engine, [extended], GREEDY)
    assert hit.num_cached_tokens >= len(prompts[4]) // 8 * 8
    same_greedy(alone, hit)


def test_padded_graph_shapes(
    make_tiny_engine, run_engine, prompts, reference, same_greedy, eager_graphs
):
    # N-gram drafts and a 32-token budget: decode steps, verify steps and short prompt chunks all
    # run padded to (batch bucket, rows per request) shapes, as CUDA graphs replay them.
    engine = make_tiny_engine(
        plugins=["fcfs", "ngram"],
        speculative="ngram",
        num_speculative_tokens=3,
        max_num_batched_tokens=32,
        max_num_seqs=16,
    )
    graphs = eager_graphs(engine, rows_per_request=(1, 4))
    # Drafts are proposed only for requests that want no logprobs.
    outputs = run_engine(engine, prompts, replace(GREEDY, logprobs=None))
    shapes = graphs.replayed
    assert {shape.rows for shape in shapes} == {1, 4}
    assert any(shape.batch > 1 for shape in shapes if shape.rows == 4)
    for expected, actual in zip(reference, outputs):
        same_greedy(expected, actual)


def test_packed_graph_token_counts():
    # Powers of two from 32 up to the asked count, never past the step budget; none for 0.
    assert token_buckets(0, 2048) == ()
    assert token_buckets(512, 2048) == (32, 64, 128, 256, 512)
    assert token_buckets(100, 64) == (32, 64)
    assert token_buckets(48, 2048) == (32, 48)
    assert token_buckets(16, 2048) == (16,)
    with pytest.raises(ValueError, match="cuda_graph_tokens must be 0 or more"):
        EngineConfig(cuda_graph_tokens=-1)


def test_packed_graph_shapes(
    make_tiny_engine, run_engine, prompts, reference, same_greedy, eager_graphs
):
    # A 40-token budget: prompt chunks share steps with the decodes of requests already running;
    # such steps replay packed graphs of 32 or 40 tokens (the step's rows, then padding rows and
    # requests that no query reaches), decode steps padded ones.
    engine = make_tiny_engine(max_num_batched_tokens=40, max_num_seqs=16)
    graphs = eager_graphs(engine, token_buckets=(32, 40))
    outputs = run_engine(engine, prompts, GREEDY)
    packed = [shape for shape in graphs.replayed if shape.rows == 0]
    assert {shape.tokens for shape in packed} == {32, 40}
    assert all(shape.batch == 16 for shape in packed)
    # The attention kernel finds a query tile's request by a binary search over the starts.
    starts = graphs.packed_starts
    assert bool((starts[1:] >= starts[:-1]).all())
    for expected, actual in zip(reference, outputs):
        same_greedy(expected, actual)
    engine.kv.check_integrity()
