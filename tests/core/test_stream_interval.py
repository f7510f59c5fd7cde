"""``stream_interval``: a streamed request's outputs come at its first token, then once per
``stream_interval`` tokens, then at its end; added up they are the outputs of streaming every
token, and the engine's pool is whole afterwards."""

import dataclasses

import pytest

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.outputs import RequestOutput, joined
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams
from tests.core.conftest import completion_fields, outputs_by_step, with_stop_strings

MODES = {
    "in turn": {"async_output": False},
    "async scheduling": {"async_output": True, "async_scheduling": True},
}
STREAMED = [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE]


@pytest.fixture(scope="module")
def prompts(tiny_llama_checkpoint, mixed_texts) -> list[list[int]]:
    return [tiny_llama_checkpoint.tokenizer.encode(text) for text in mixed_texts]


@pytest.fixture(scope="module")
def params(make_tiny_engine, prompts) -> list[SamplingParams]:
    """Greedy, seeded sampling, logprobs and one-token requests; every other one with a stop string."""
    greedy = SamplingParams(temperature=0, max_tokens=23, ignore_eos=True)
    kinds = [
        greedy,
        SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=17, ignore_eos=True),
        dataclasses.replace(greedy, logprobs=2),
        dataclasses.replace(greedy, max_tokens=1),
    ]
    return with_stop_strings(
        make_tiny_engine(async_output=False),
        prompts,
        [kinds[i % len(kinds)] for i in range(len(prompts))],
    )


def _token_counts(outputs: list[RequestOutput], kind: RequestOutputKind) -> list[int]:
    """How many tokens the request had sent with each output."""
    sizes = [len(o.outputs[0].token_ids) for o in outputs]
    if kind is RequestOutputKind.CUMULATIVE:
        return sizes
    return [sum(sizes[: i + 1]) for i in range(len(sizes))]


@pytest.mark.parametrize("kind", STREAMED, ids=lambda k: k.name.lower())
@pytest.mark.parametrize("mode", MODES)
def test_outputs_every_interval_add_up_to_every_token(
    make_tiny_engine, prompts, params, mode, kind
):
    every = outputs_by_step(make_tiny_engine(**MODES[mode]), prompts, params, kind)
    sparse = outputs_by_step(
        make_tiny_engine(stream_interval=3, **MODES[mode]), prompts, params, kind
    )
    ended_by_stop = 0
    for req_id, outputs in every.items():
        held = sparse[req_id]
        whole = joined(held) if kind is RequestOutputKind.DELTA else held[-1]
        last = joined(outputs) if kind is RequestOutputKind.DELTA else outputs[-1]
        assert completion_fields(whole) == completion_fields(last)
        assert [o.finished for o in held] == [False] * (len(held) - 1) + [True]
        ended_by_stop += last.outputs[0].stop_reason is not None
        # One token per step: the first token, then every third, then the end.
        total = len(last.outputs[0].token_ids)
        assert _token_counts(outputs, kind) == list(range(1, total + 1))
        assert _token_counts(held, kind) == sorted({*range(1, total + 1, 3), total}), req_id
    assert ended_by_stop >= 2


def test_final_only_requests_are_unchanged(make_tiny_engine, prompts, params):
    kind = RequestOutputKind.FINAL_ONLY
    every = outputs_by_step(make_tiny_engine(), prompts, params, kind)
    sparse = outputs_by_step(make_tiny_engine(stream_interval=4), prompts, params, kind)
    assert {k: [completion_fields(o) for o in v] for k, v in sparse.items()} == {
        k: [completion_fields(o) for o in v] for k, v in every.items()
    }


def test_an_interval_below_one_is_refused():
    with pytest.raises(ValueError, match="stream_interval must be at least 1"):
        EngineConfig(stream_interval=0)


@pytest.mark.parametrize("interval", [1, 3])
def test_first_and_final_sends_the_first_token_then_the_rest(
    make_tiny_engine, prompts, params, interval
):
    """A non-streamed HTTP call's kind: two deltas (one for a one-token request), whatever the
    engine's stream interval, adding up to every token's."""
    every = outputs_by_step(make_tiny_engine(), prompts, params, RequestOutputKind.DELTA)
    kind = RequestOutputKind.FIRST_AND_FINAL
    two = outputs_by_step(make_tiny_engine(stream_interval=interval), prompts, params, kind)
    for req_id, outputs in every.items():
        total = sum(len(o.outputs[0].token_ids) for o in outputs)
        sizes = [len(o.outputs[0].token_ids) for o in two[req_id]]
        assert sizes == ([1] if total == 1 else [1, total - 1]), req_id
        assert completion_fields(joined(two[req_id])) == completion_fields(joined(outputs))
