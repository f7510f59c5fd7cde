"""Tensor parallelism on the CPU: two processes over gloo give TP=1's greedy tokens, and a dead rank fails the engine.

The default model's 3 KV heads split 2 + 1 over two ranks (its 9 query heads 6 + 3), so the parity
test runs on the default model itself, on its parity prompts (`test_default_model.PROMPTS`), in
float32. The two runs may part only at a near-tie (top two logprobs closer than ``TIE``): the
row-parallel sums add the same products in another order, which moves logits by about 1e-6.
"""

import dataclasses
import datetime
import os
import signal
import threading
import time

import pytest
import torch

from spyglass import LLM, SamplingParams
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.runner.parallel import TensorParallelError
from spyglass.core.engine.runner.parallel.comm import STEP_TIMEOUT
from spyglass.core.models.parallel.shard import check_tensor_parallel, plan_shard, shard_weights
from spyglass.tests.core.test_default_model import PROMPTS

TIE = 1e-3
NUM_TOKENS = 16


class StatsRecorder:
    """Records the engine info and step stats the engine announces."""

    def __init__(self):
        self.info = None
        self.steps = []

    @hookimpl
    def spyglass_step_finished(self, stats):
        """Keep the step's stats."""
        self.steps.append(stats)


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)


def _token_ids(engine, texts: list[str]) -> list[list[int]]:
    return [engine.tokenizer.encode(text) for text in texts]


def _compare(reference, outputs, same_greedy, logprob_tol: float = 1e-4) -> int:
    """Assert each pair agrees up to a near-tie; print and return how many parted at one."""
    ties = sum(
        same_greedy(want, got, tie=TIE, logprob_tol=logprob_tol)
        for want, got in zip(reference, outputs)
    )
    print(
        f"\ntensor parallel parity: {ties} of {len(outputs)} prompts parted at a near-tie (<{TIE})"
    )
    return ties


def test_shard_plan_of_the_default_model(default_checkpoint):
    arch = default_checkpoint.arch
    first, second = plan_shard(arch, 0, 2), plan_shard(arch, 1, 2)
    assert (first.kv_heads, first.q_heads) == (range(0, 2), range(0, 6))
    assert (second.kv_heads, second.q_heads) == (range(2, 3), range(6, 9))
    assert (first.intermediate, second.intermediate) == (range(0, 768), range(768, 1536))
    assert (first.vocab, second.vocab) == (range(0, 24576), range(24576, 49152))
    with pytest.raises(ValueError, match="exceeds the model's 3 KV heads"):
        check_tensor_parallel(arch, 4)
    with pytest.raises(ValueError, match="not 'gemma2'"):
        check_tensor_parallel(dataclasses.replace(arch, architecture="gemma2"), 2)


def test_shards_put_back_together_are_the_checkpoint(tiny_llama_checkpoint):
    arch, weights = tiny_llama_checkpoint.arch, tiny_llama_checkpoint.weights
    shards = [shard_weights(weights, arch, plan_shard(arch, rank, 2)) for rank in range(2)]
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(torch.cat([s[name] for s in shards], dim=1), weights[name])
    name = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(torch.cat([s[name] for s in shards], dim=1), weights[name])
    q_rows = arch.head_dim * arch.num_attention_heads // 2
    qkv = shards[1]["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv[:q_rows], weights["model.layers.0.self_attn.q_proj.weight"][q_rows:])
    assert torch.equal(torch.cat([s["lm_head.weight"] for s in shards]), weights["lm_head.weight"])


@pytest.mark.slow
def test_default_model_two_ranks_match_one_on_the_parity_prompts(
    make_default_engine, run_engine, same_greedy
):
    params = _greedy(NUM_TOKENS)
    single = make_default_engine(num_kv_blocks=400)
    prompts = _token_ids(single, PROMPTS)
    start = time.perf_counter()
    reference = run_engine(single, prompts, params)
    single_seconds = time.perf_counter() - start
    single.shutdown()
    engine = make_default_engine(num_kv_blocks=400, tensor_parallel_size=2)
    start = time.perf_counter()
    try:
        assert engine.info.tensor_parallel_size == 2
        outputs = run_engine(
            engine, prompts, params
        )  # checks KV integrity each step and that no block leaked
    finally:
        engine.shutdown()
    print(
        f"\nTP=1 {single_seconds:.1f} s, TP=2 {time.perf_counter() - start:.1f} s (engine start included)"
    )
    assert _compare(reference, outputs, same_greedy) <= len(PROMPTS) // 4


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_tiny_llama_two_ranks_match_one(
    make_tiny_engine, run_engine, same_greedy, mixed_texts, quantization
):
    """Even heads (4 query, 2 KV); int8 shards Q8_0 blocks by rows and, on block edges, by columns.

    The int8 kernels quantize their inputs to 8 bits as well, which turns a 1e-6 change in a sum
    into a changed rounding step now and then: their logprobs may move by up to 1e-3.
    """
    params = _greedy(16)
    single = make_tiny_engine(quantization=quantization)
    prompts = _token_ids(single, mixed_texts)
    reference = run_engine(single, prompts, params)
    engine = make_tiny_engine(quantization=quantization, tensor_parallel_size=2)
    recorder = StatsRecorder()
    engine.plugin_manager.register(recorder)
    try:
        outputs = run_engine(engine, prompts, params)
    finally:
        engine.shutdown()
    _compare(reference, outputs, same_greedy, logprob_tol=1e-4 if quantization == "none" else 1e-3)
    assert recorder.steps and all(stats.tensor_parallel_size == 2 for stats in recorder.steps)
    assert not any(
        p.is_alive() for p in engine.runner.group.processes
    )  # shutdown stopped the worker


def _engine_with_work(make_tiny_engine, num_requests: int = 4):
    engine = make_tiny_engine(tensor_parallel_size=2)
    for index in range(num_requests):
        engine.add_request(
            f"r{index}", [5 + index] * 40, SamplingParams(max_tokens=500, ignore_eos=True)
        )
    engine.step()
    return engine


@pytest.mark.timeout(90, method="thread")
def test_a_killed_worker_fails_the_next_step_clearly(make_tiny_engine):
    engine = _engine_with_work(make_tiny_engine)
    os.kill(engine.runner.group.processes[0].pid, signal.SIGKILL)
    engine.runner.group.processes[0].join(timeout=10)
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
        engine.step()
    assert time.monotonic() - start < 5
    # the engine stays failed: no step runs on a broken group
    with pytest.raises(TensorParallelError):
        engine.step()
    engine.shutdown()


@pytest.mark.timeout(90, method="thread")
def test_a_worker_killed_mid_run_fails_the_engine_within_seconds(make_tiny_engine):
    """Killed at a moment the test does not choose: between steps or inside one (a collective sees the peer go)."""
    engine = _engine_with_work(make_tiny_engine, num_requests=8)
    pid = engine.runner.group.processes[0].pid
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match="rank 1"):
        while engine.has_unfinished_requests:
            engine.step()
    assert time.monotonic() - start < 20
    engine.shutdown()


@pytest.mark.timeout(90, method="thread")
def test_a_stopped_worker_fails_the_engine_after_the_step_timeout(make_tiny_engine):
    """Alive but not answering (SIGSTOP): rank 0 stops waiting on the collective at the step timeout."""
    engine = _engine_with_work(make_tiny_engine)
    group = engine.runner.group
    group.step_timeout = datetime.timedelta(seconds=2)
    os.kill(group.processes[0].pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        with pytest.raises(TensorParallelError, match="did not finish within 0:00:02"):
            engine.step()
        assert 2 <= time.monotonic() - start < 10
        assert not group.processes[0].is_alive()  # the failed group took its workers down
        # Rank 0's control sends (the step's inputs) give up within a step's time: a send that pends
        # forever would hang the group's destructor (it joins gloo's thread) wherever it runs.
        assert group.control.options._timeout == STEP_TIMEOUT < datetime.timedelta(days=1)
    finally:
        if group.processes[0].is_alive():
            os.kill(group.processes[0].pid, signal.SIGKILL)
        engine.shutdown()


def test_llm_api_with_tensor_parallel_size(tiny_llama_dir):
    options = dict(
        model=str(tiny_llama_dir),
        dtype="float32",
        device="cpu",
        plugins=["fcfs"],
        kv_cache_memory="64MiB",
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = ["The quick brown fox", "def add(a, b):"]
    want = [
        o.outputs[0].token_ids for o in LLM(**options).generate(prompts, params, use_tqdm=False)
    ]
    llm = LLM(tensor_parallel_size=2, **options)
    try:
        assert llm.engine.info.tensor_parallel_size == 2
        assert [
            o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)
        ] == want
    finally:
        llm.engine.shutdown()


def test_too_many_ranks_is_a_clear_error(make_default_engine):
    with pytest.raises(ValueError, match="tensor_parallel_size 4 exceeds the model's 3 KV heads"):
        make_default_engine(tensor_parallel_size=4)
