"""Random workloads on the tiny Llama (and the sliding-window Mistral): arrivals between steps, aborts,
a KV budget small enough to preempt.

After every step the KV bookkeeping must be consistent; at the end every block is back in the
pool, nothing is left queued, and every request ended exactly once with a reason.
"""

import random
from collections import Counter
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.loaders.load import load_checkpoint

STOP_CHOICES = [[], [], [], ["e"], [" a", "\n"], ["the"]]


@dataclass(frozen=True)
class RequestPlan:
    """One request of a workload: when it arrives, what it asks, and maybe when it is aborted."""

    arrival_step: int
    prompt_seed: int
    prompt_len: int
    max_tokens: int
    abort_step: int | None
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    logprobs: int | None
    shares_prefix: bool = False


@dataclass(frozen=True)
class Workload:
    """An engine shape and the requests to throw at it."""

    block_size: int
    num_kv_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    requests: tuple[RequestPlan, ...]
    prefix_caching: bool = False
    shared_prefix_len: int = 0


@st.composite
def workloads(draw) -> Workload:
    block_size = draw(st.sampled_from([4, 8, 16]))
    num_kv_blocks = draw(st.integers(4, 12))
    capacity = block_size * num_kv_blocks
    prefix_caching = draw(st.booleans())
    shared_prefix_len = draw(st.integers(0, 3)) * block_size
    plans = []
    for _ in range(draw(st.integers(1, 8))):
        shares_prefix = draw(st.booleans())
        prompt_len = draw(st.integers(1, 40)) + (shared_prefix_len if shares_prefix else 0)
        prompt_len = min(prompt_len, capacity - 1)
        plans.append(
            RequestPlan(
                arrival_step=draw(st.integers(0, 8)),
                prompt_seed=draw(st.integers(0, 2**16)),
                prompt_len=prompt_len,
                max_tokens=min(draw(st.integers(4, 32)), capacity - prompt_len),
                abort_step=draw(st.none() | st.integers(0, 30)),
                temperature=draw(st.sampled_from([0.0, 0.8])),
                seed=draw(st.none() | st.integers(0, 100)),
                stop=tuple(draw(st.sampled_from(STOP_CHOICES))),
                logprobs=draw(st.none() | st.integers(0, 3)),
                shares_prefix=shares_prefix,
            )
        )
    return Workload(
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        max_num_batched_tokens=draw(st.sampled_from([8, 16, 32, 128])),
        max_num_seqs=draw(st.integers(2, 8)),
        requests=tuple(plans),
        prefix_caching=prefix_caching,
        shared_prefix_len=shared_prefix_len,
    )


def prompt_for(plan: RequestPlan, workload: Workload, vocab_size: int) -> list[int]:
    """Random token ids; requests that share a prefix start with the workload's common blocks."""
    rng = random.Random(plan.prompt_seed)
    own = [rng.randrange(3, vocab_size) for _ in range(plan.prompt_len)]
    if not plan.shares_prefix:
        return own
    shared = random.Random(-1)
    prefix = [shared.randrange(3, vocab_size) for _ in range(workload.shared_prefix_len)]
    return (prefix + own)[: plan.prompt_len]


def run_workload(engine, workload: Workload, preemptions, max_steps: int = 2000) -> Counter:
    """Drive the engine through the workload, checking invariants as it goes; returns what happened.

    ``preemptions`` is the `PreemptionCounter` registered on ``engine``.
    """
    stats = Counter()
    plans = {f"w{i}": plan for i, plan in enumerate(workload.requests)}
    requests = {}
    history = []
    last: dict[str, object] = {}
    final: dict[str, object] = {}

    def record(output):
        req_id = output.request_id
        assert req_id not in final, f"{req_id} produced output after its final one"
        previous = last.get(req_id)
        if previous is not None:
            before, now = previous.outputs[0], output.outputs[0]
            assert now.token_ids[: len(before.token_ids)] == before.token_ids
            assert now.text.startswith(before.text)
        last[req_id] = output
        history.append(output)
        if output.finished:
            final[req_id] = output

    step = 0
    while step < max_steps:
        for req_id, plan in plans.items():
            if plan.arrival_step == step:
                params = SamplingParams(
                    temperature=plan.temperature,
                    seed=plan.seed,
                    max_tokens=plan.max_tokens,
                    stop=list(plan.stop),
                    logprobs=plan.logprobs,
                    ignore_eos=True,
                )
                requests[req_id] = engine.add_request(
                    req_id, prompt_for(plan, workload, engine.arch.vocab_size), params
                )
            if plan.abort_step == step and req_id in engine.requests:
                output = engine.abort(req_id)
                assert output.finished and output.outputs[0].finish_reason == "abort"
                record(output)
                stats["aborts"] += 1
        for output in engine.step():
            record(output)
        engine.kv.check_integrity()
        for request in engine.scheduler.running:
            assert (
                len(engine.kv.block_table(request.req_id)) * workload.block_size
                >= request.num_computed_tokens
            )
            # Steps a request spent with blocks given back (sliding-window models only).
            stats["released"] += engine.kv.num_held_blocks(request.req_id) < len(
                engine.kv.block_table(request.req_id)
            )
        step += 1
        if (
            step > max(p.arrival_step for p in plans.values())
            and not engine.has_unfinished_requests
        ):
            break
    assert not engine.has_unfinished_requests, f"still busy after {max_steps} steps"

    pool = engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert not engine.kv.block_tables and not engine.requests and not engine.outputs.detokenizers
    assert not engine.scheduler.waiting and not engine.scheduler.running
    assert final.keys() == plans.keys()
    for req_id, output in final.items():
        plan, completion = plans[req_id], output.outputs[0]
        reason = completion.finish_reason
        stats[reason] += 1
        stats["cached_tokens"] += output.num_cached_tokens
        assert output.num_cached_tokens == 0 or workload.prefix_caching
        assert reason in ("length", "stop", "abort"), (req_id, reason)
        assert len(completion.token_ids) <= plan.max_tokens
        if reason == "length":
            assert len(completion.token_ids) == plan.max_tokens
        elif reason == "stop":
            assert completion.stop_reason in plan.stop
            assert plan.stop and completion.stop_reason not in completion.text
        if plan.logprobs is not None and reason != "abort":
            assert len(completion.logprobs) == len(completion.token_ids)
    for output in history:  # outputs are snapshots: later steps do not change them
        completion = output.outputs[0]
        if completion.logprobs is not None:
            assert len(completion.logprobs) == len(completion.token_ids)
    preempted = Counter(preemptions.req_ids)
    assert {
        req_id: r.num_preemptions for req_id, r in requests.items() if r.num_preemptions
    } == preempted
    stats["preemptions"] += len(preemptions.req_ids)
    stats["preempted_requests"] += len(set(preemptions.req_ids))
    return stats


def test_random_workloads(make_tiny_engine, count_preemptions):
    check_random_workloads(make_tiny_engine, count_preemptions, max_examples=100)


def test_random_workloads_sliding_window(tiny_family_dir, tiny_engine_factory, count_preemptions):
    # The tiny Mistral (every layer slides over 16 positions) gives blocks back as requests advance.
    path = tiny_family_dir("mistral")
    make_engine = tiny_engine_factory(path, load_checkpoint(str(path), torch.float32))
    assert make_engine().kv.sliding_window == 16
    totals = check_random_workloads(make_engine, count_preemptions, max_examples=40)
    assert totals["released"] >= 100


def check_random_workloads(make_tiny_engine, count_preemptions, max_examples: int) -> Counter:
    """Run ``max_examples`` hypothesis workloads on engines from ``make_tiny_engine``; check they reach every path."""
    totals = Counter()

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(workloads())
    def check(workload: Workload):
        engine = make_tiny_engine(
            plugins=["fcfs", "prefix_cache"] if workload.prefix_caching else ["fcfs"],
            block_size=workload.block_size,
            num_kv_blocks=workload.num_kv_blocks,
            max_num_batched_tokens=workload.max_num_batched_tokens,
            max_num_seqs=workload.max_num_seqs,
        )
        totals.update(run_workload(engine, workload, count_preemptions(engine)))

    check()
    print(f"\nrandom workloads: {dict(totals)}")
    # The strategy must actually reach the interesting paths, not only pass vacuously.
    assert totals["preemptions"] >= 10 and totals["aborts"] >= 10
    assert totals["length"] and totals["stop"] and totals["abort"] and totals["cached_tokens"]
    return totals


def test_fixed_workload_preempts_and_aborts(make_tiny_engine, count_preemptions):
    # Six requests of 40 tokens in 12 blocks of 8: preemption is certain; aborts hit waiting and running requests.
    plans = tuple(
        RequestPlan(
            arrival_step=i // 2,
            prompt_seed=i,
            prompt_len=30,
            max_tokens=10,
            abort_step={1: 0, 3: 6}.get(i),
            temperature=0.0 if i % 2 else 0.8,
            seed=i,
            stop=(),
            logprobs=None,
        )
        for i in range(6)
    )
    workload = Workload(
        block_size=8, num_kv_blocks=12, max_num_batched_tokens=32, max_num_seqs=6, requests=plans
    )
    engine = make_tiny_engine(block_size=8, num_kv_blocks=12, max_num_batched_tokens=32)
    stats = run_workload(engine, workload, count_preemptions(engine))
    assert stats["preemptions"] >= 1 and stats["aborts"] == 2
    assert stats["length"] == 4 and stats["abort"] == 2
