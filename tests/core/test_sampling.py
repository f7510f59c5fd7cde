"""Sampling: the sampler on hand-made logits, then seeds, filters, penalties and logprobs through the tiny engine."""

import dataclasses
import math
from collections import Counter

import pytest
import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.logprob_rows import logprob_list, logprob_rows
from spyglass.core.engine.runner.penalty_counts import PenaltyCounts
from spyglass.core.engine.runner.row_tensors import argmax_rows
from spyglass.core.engine.runner.sampler import sample_tokens
from spyglass.core.engine.runner.token_draw import target_probs
from spyglass.core.engine.sampling_params import SamplingParams

# Probabilities 0.5, 0.3, 0.15, 0.05 (then two impossible tokens).
PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0, 0.0])
LOGITS = torch.log(PROBS.clamp_min(1e-30))


def sample(logits: torch.Tensor, requests: list[Request], penalties: PenaltyCounts):
    """Each row's token, and its logprob where its request asks, as the engine samples them."""
    token_ids = sample_tokens(logits, requests, penalties)
    tokens = token_ids.tolist()
    rows = logprob_rows(logits, token_ids, requests)
    return tokens, logprob_list(rows, tokens, len(requests))


def make_request(params: SamplingParams, prompt=(1, 2, 3), output=()) -> Request:
    request = Request("r", list(prompt), params)
    request.output_token_ids = list(output)
    return request


def draw_many(
    params: SamplingParams, num_draws: int = 2000, logits: torch.Tensor = LOGITS
) -> Counter:
    """Token frequencies over many unseeded rows of the same logits (one sampler call)."""
    torch.manual_seed(0)
    requests = [make_request(params) for _ in range(num_draws)]
    token_ids, _ = sample(logits.expand(num_draws, -1).clone(), requests, PenaltyCounts())
    return Counter(token_ids)


# -- the sampler on hand-made logits ------------------------------------------------------------


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 2.0, 0.3], [5.0, -1.0, 4.9]])
    requests = [make_request(SamplingParams(temperature=0)) for _ in range(2)]
    assert sample(logits, requests, PenaltyCounts())[0] == [1, 0]


def test_the_cpu_argmax_is_torchs_on_ties_nans_infinities_and_views():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 49152, generator=generator)
    logits[1, [5, 700]] = 100.0  # a tie: the first
    logits[2, [10, 20]] = float("nan")  # NaN is the largest, the first of them
    logits[3] = float("-inf")
    logits[4, [3, 9]] = float("inf")
    logits[5] = 0.0
    for x in (logits, logits[:, ::3], logits.t().contiguous().t(), logits.bfloat16()):
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    assert argmax_rows(logits)[:6].tolist()[1:] == [5, 10, 0, 3, 0]


def test_temperature_one_follows_the_distribution():
    counts = draw_many(SamplingParams(temperature=1.0), num_draws=4000)
    assert set(counts) <= {0, 1, 2, 3}
    for token_id, p in enumerate(PROBS[:4].tolist()):
        assert counts[token_id] / 4000 == pytest.approx(p, abs=0.03)


def test_low_temperature_concentrates_and_high_flattens():
    cold = draw_many(SamplingParams(temperature=0.05))
    hot = draw_many(SamplingParams(temperature=5.0))
    assert cold[0] >= 1995
    assert hot[3] > 250  # 0.05 at T=1, ~0.20 at T=5


@pytest.mark.parametrize(
    "params, allowed",
    [
        (SamplingParams(top_k=2), {0, 1}),
        (SamplingParams(top_k=3), {0, 1, 2}),
        (
            SamplingParams(top_p=0.7),
            {0, 1},
        ),  # 0.5 before token 1 is under 0.7; 0.8 before token 2 is not
        (SamplingParams(top_p=0.85), {0, 1, 2}),
        (SamplingParams(min_p=0.5), {0, 1}),  # floor 0.25
        (SamplingParams(min_p=0.2), {0, 1, 2}),  # floor 0.10
        (SamplingParams(top_k=3, top_p=0.7), {0, 1}),
    ],
)
def test_filters_keep_exactly_the_allowed_tokens(params, allowed):
    assert set(draw_many(params)) == allowed


def test_top_k_beyond_the_vocabulary_keeps_every_token():
    # Regression: the top-k-only path asked torch.topk for more values than the vocabulary has and raised,
    # failing every request in the step.
    params = [SamplingParams(top_k=100), SamplingParams(top_k=1000)]
    assert set(draw_many(params[0])) == {0, 1, 2, 3}
    token_ids, _ = sample(
        LOGITS.expand(2, -1).clone(), [make_request(p) for p in params], PenaltyCounts()
    )
    assert all(t in (0, 1, 2, 3) for t in token_ids)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=1),
        SamplingParams(top_p=1e-6),
        SamplingParams(min_p=1.0),
        SamplingParams(temperature=0),
    ],
)
def test_degenerate_filters_are_greedy(params):
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(3))
    requests = [make_request(params) for _ in range(64)]
    torch.manual_seed(1)
    assert sample(logits.clone(), requests, PenaltyCounts())[0] == logits.argmax(dim=-1).tolist()


def test_seeded_rows_ignore_their_companions():
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(5))
    seeded = SamplingParams(seed=42)
    [alone], _ = sample(logits[2:3].clone(), [make_request(seeded)], PenaltyCounts())
    companions = [
        [SamplingParams(), SamplingParams(temperature=0), SamplingParams(seed=1)],
        [SamplingParams(seed=9), SamplingParams(seed=9), SamplingParams(top_k=5)],
    ]
    for index, others in enumerate(companions):
        params = others[:2] + [seeded] + others[2:]
        torch.manual_seed(index)  # the unseeded rows draw from the global generator
        token_ids, _ = sample(logits.clone(), [make_request(p) for p in params], PenaltyCounts())
        assert token_ids[2] == alone


def test_seed_sequence_is_reproducible_and_seed_dependent():
    logits = torch.zeros(1, 1000)  # uniform: every draw is pure seed

    def sequence(seed):
        request = make_request(SamplingParams(seed=seed))
        return [sample(logits.clone(), [request], PenaltyCounts())[0][0] for _ in range(20)]

    assert sequence(7) == sequence(7)
    assert sequence(7) != sequence(8)
    assert len(set(sequence(7))) > 10  # the generator advances from one token to the next


def test_frequency_and_presence_penalties():
    logits = torch.zeros(1, 6)
    request = make_request(
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), prompt=[4], output=[1, 1, 2]
    )
    PenaltyCounts().apply(logits, [request])
    # Output tokens only: token 1 twice, token 2 once; the prompt's token 4 is untouched.
    assert logits[0].tolist() == pytest.approx([0.0, -1.25, -0.75, 0.0, 0.0, 0.0])


def test_repetition_penalty_pushes_seen_tokens_towards_unlikely():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    request = make_request(SamplingParams(repetition_penalty=2.0), prompt=[0], output=[1])
    PenaltyCounts().apply(logits, [request])
    assert logits[0].tolist() == [1.0, -4.0, 2.0, -2.0]


def test_penalties_change_the_choice_but_not_the_reported_logprobs():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    request = make_request(
        SamplingParams(temperature=0, frequency_penalty=1.0, logprobs=2), output=[0]
    )
    [token_id], [logprob] = sample(logits.clone(), [request], PenaltyCounts())
    assert token_id == 1
    raw = logits.log_softmax(dim=-1)[0]
    assert logprob.token_id == 1 and logprob.logprob == pytest.approx(raw[1].item())
    assert logprob.top == pytest.approx({0: raw[0].item(), 1: raw[1].item()})


def test_logprobs_per_request():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    requests = [
        make_request(SamplingParams(temperature=0, logprobs=5)),
        make_request(SamplingParams(temperature=0)),
        make_request(SamplingParams(temperature=0, logprobs=0)),
    ]
    token_ids, logprobs = sample(logits.clone(), requests, PenaltyCounts())
    expected = logits.log_softmax(dim=-1)
    first, none, zero = logprobs
    assert none is None
    assert zero.top == {} and zero.logprob == pytest.approx(expected[2, token_ids[2]].item())
    assert list(first.top) == expected[0].topk(5).indices.tolist()
    assert list(first.top.values()) == pytest.approx(expected[0].topk(5).values.tolist())
    assert first.logprob == first.top[token_ids[0]] == max(first.top.values())


# -- through the engine (tiny random Llama: near-uniform logits, so samples vary a lot) -----------


@pytest.fixture(scope="module")
def prompts(tiny_llama_checkpoint):
    tokenizer = tiny_llama_checkpoint.tokenizer
    texts = [
        "Hello world",
        "the the the the the the",
        "abc abc abc abc",
        "1 2 3 4 5",
        "def f(x):\n    return x * 2",
    ]
    return [tokenizer.encode(text) for text in texts]


@pytest.fixture(scope="module")
def engine(make_tiny_engine):
    return make_tiny_engine()


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_seeded_output_independent_of_batch(engine, run_engine, prompts):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    [alone] = tokens(run_engine(engine, [prompts[0]], seeded))
    others = [
        SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=8),
    ]
    batch = run_engine(engine, [prompts[1], prompts[0], prompts[2]], [others[0], seeded, others[1]])
    assert tokens(batch)[1] == alone
    # Same seed on another batch position, next to a copy of itself with another seed.
    reseeded = SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True)
    again = run_engine(engine, [prompts[0], prompts[3], prompts[0]], [reseeded, others[0], seeded])
    assert tokens(again)[2] == alone
    assert tokens(again)[0] != alone


def test_seeded_output_survives_preemption(
    make_tiny_engine, run_engine, count_preemptions, prompts
):
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=24, ignore_eos=True)
        for s in range(len(prompts))
    ]
    roomy = tokens(run_engine(make_tiny_engine(), prompts, params))
    tight_engine = make_tiny_engine(block_size=4, num_kv_blocks=14)
    preemptions = count_preemptions(tight_engine)
    assert tokens(run_engine(tight_engine, prompts, params)) == roomy
    assert preemptions.req_ids


def test_unseeded_samples_differ(engine, run_engine, prompts):
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    first, second = tokens(run_engine(engine, [prompts[0]] * 2, params))
    assert first != second


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0, top_p=1e-6),
        SamplingParams(temperature=0.8, min_p=1.0),
    ],
    ids=["top_k=1", "tiny top_p", "min_p=1"],
)
def test_degenerate_sampling_equals_greedy(engine, run_engine, prompts, params):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    params = dataclasses.replace(params, max_tokens=12, ignore_eos=True, seed=5)
    assert tokens(run_engine(engine, prompts, params)) == tokens(
        run_engine(engine, prompts, greedy)
    )


def test_huge_top_k_runs(engine, run_engine, prompts):
    [output] = run_engine(
        engine, prompts[:1], SamplingParams(top_k=10**6, seed=0, max_tokens=3, ignore_eos=True)
    )
    assert output.outputs[0].finish_reason == "length"


def test_top_k_limits_choices_to_the_top_k(engine, run_engine, prompts):
    params = SamplingParams(
        temperature=1.0, top_k=3, seed=11, max_tokens=12, ignore_eos=True, logprobs=3
    )
    for output in run_engine(engine, prompts, params):
        completion = output.outputs[0]
        for token_id, logprob in zip(completion.token_ids, completion.logprobs):
            assert token_id in logprob.top


def repeats(outputs) -> int:
    return sum(len(ids) - len(set(ids)) for ids in tokens(outputs))


@pytest.mark.parametrize(
    "penalty",
    [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 2.0}],
    ids=lambda p: next(iter(p)),
)
def test_strong_penalties_stop_repeats(engine, run_engine, prompts, penalty):
    base = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    baseline = run_engine(engine, prompts, base)
    assert repeats(baseline) >= 4  # the random model loops, so there is something to prevent
    penalised = run_engine(
        engine, prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, **penalty)
    )
    assert repeats(penalised) == 0


def test_engine_logprobs(engine, run_engine, prompts):
    greedy, sampled = (
        SamplingParams(temperature=t, seed=3, max_tokens=10, ignore_eos=True, logprobs=4)
        for t in (0, 1.0)
    )
    for output in run_engine(engine, prompts[:3], greedy) + run_engine(
        engine, prompts[:3], sampled
    ):
        completion = output.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids) == 10
        for token_id, logprob in zip(completion.token_ids, completion.logprobs):
            values = list(logprob.top.values())
            assert len(values) == 4 and values == sorted(values, reverse=True)
            assert logprob.token_id == token_id and logprob.logprob <= 0
            assert sum(math.exp(v) for v in values) <= 1 + 1e-5
            if token_id in logprob.top:
                assert logprob.logprob == pytest.approx(logprob.top[token_id])
            else:
                assert logprob.logprob <= values[-1]
    for output in run_engine(engine, prompts[:3], greedy):
        for token_id, logprob in zip(output.outputs[0].token_ids, output.outputs[0].logprobs):
            assert token_id == next(iter(logprob.top))


def test_streamed_outputs_are_snapshots(engine, prompts):
    # Each output is what the request had at that step: its logprobs must not keep growing afterwards
    # (a streaming consumer on another thread slices them by its count of tokens).
    engine.add_request(
        "snap", prompts[0], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    )
    outputs = []
    while engine.has_unfinished_requests:
        outputs.extend(engine.step())
    assert [len(o.outputs[0].token_ids) for o in outputs] == [1, 2, 3, 4, 5, 6]
    assert [len(o.outputs[0].logprobs) for o in outputs] == [1, 2, 3, 4, 5, 6]


def test_a_top_p_that_rounds_to_zero_keeps_the_most_likely_token():
    # The engine thread flushes denormals to zero: a top_p of 5e-324 (valid when checked) compares as 0 there.
    params = SamplingParams(temperature=1.0, top_p=0.5)
    params.top_p = 0.0
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    probs = target_probs(logits, [Request("r", [1], params)])
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0]]))
