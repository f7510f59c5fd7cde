"""Output kinds: delta outputs add up, step by step, to the cumulative ones; a final-only request
has one output, the cumulative one's last; a listener that fell behind gets what it missed in one
output of its kind."""

import asyncio
import dataclasses
from concurrent.futures import Future

import pytest

from spyglass.core.engine.output_streams import OutputStreams
from spyglass.core.engine.outputs import CompletionOutput, Logprob, RequestOutput, joined
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams
from tests.core.conftest import completion_fields, outputs_by_step, with_stop_strings

MODES = {
    "in turn": {"async_output": False},
    "async output": {"async_output": True},
    "async scheduling": {"async_output": True, "async_scheduling": True},
}


@pytest.fixture(scope="module")
def prompts(tiny_llama_checkpoint, mixed_texts) -> list[list[int]]:
    return [tiny_llama_checkpoint.tokenizer.encode(text) for text in mixed_texts]


@pytest.mark.parametrize("mode", MODES)
def test_deltas_add_up_to_the_cumulative_outputs_and_final_only_is_its_last(
    make_tiny_engine, prompts, mode
):
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    kinds = [
        greedy,
        SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=17, ignore_eos=True),
        dataclasses.replace(greedy, logprobs=2),
        dataclasses.replace(greedy, max_tokens=1),
    ]
    params = with_stop_strings(
        make_tiny_engine(async_output=False),
        prompts,
        [kinds[i % len(kinds)] for i in range(len(prompts))],
    )
    runs = {
        kind: outputs_by_step(make_tiny_engine(**MODES[mode]), prompts, params, kind)
        for kind in RequestOutputKind
    }
    cumulative = runs[RequestOutputKind.CUMULATIVE]
    assert sum(o[-1].outputs[0].stop_reason is not None for o in cumulative.values()) >= 3
    assert any(len(o) > 10 for o in cumulative.values())
    for req_id, snapshots in cumulative.items():
        deltas = runs[RequestOutputKind.DELTA][req_id]
        assert len(deltas) == len(snapshots)
        added_up = [joined(deltas[: step + 1]) for step in range(len(deltas))]
        assert [completion_fields(o) for o in added_up] == [completion_fields(o) for o in snapshots]
        assert [o.finished for o in deltas] == [o.finished for o in snapshots]
        assert all(o.prompt_token_ids == snapshots[0].prompt_token_ids for o in deltas)
        (final,) = runs[RequestOutputKind.FINAL_ONLY][req_id]
        assert final.finished
        assert completion_fields(final) == completion_fields(snapshots[-1])


def test_a_cumulative_output_is_a_snapshot(make_tiny_engine, prompts):
    """An output does not grow with its request after it is handed out."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    (outputs,) = outputs_by_step(
        make_tiny_engine(), prompts[:1], [params], RequestOutputKind.CUMULATIVE
    ).values()
    assert [len(o.outputs[0].token_ids) for o in outputs] == list(range(1, 13))
    assert [len(o.outputs[0].logprobs) for o in outputs] == list(range(1, 13))


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
def test_an_aborted_request_ends_with_an_output_of_its_kind(make_tiny_engine, prompts, kind):
    engine = make_tiny_engine()
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, output_kind=kind)
    engine.add_request("r", list(prompts[0]), params)
    streamed = []
    while len(streamed) < 4:
        streamed += [o.outputs[0].token_ids for o in engine.step()]
        if kind is RequestOutputKind.FINAL_ONLY and engine.requests["r"].num_output_tokens >= 4:
            break
    num_generated = engine.requests["r"].num_output_tokens
    final = engine.abort("r")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    if kind is RequestOutputKind.DELTA:
        assert sum(map(len, streamed)) + len(final.outputs[0].token_ids) == num_generated
    else:
        assert streamed == [] and len(final.outputs[0].token_ids) == num_generated
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    assert not engine.outputs.detokenizers


def _output(text: str, token_ids: list[int], finished: bool = False) -> RequestOutput:
    logprobs = [Logprob(t, -1.0, {}) for t in token_ids]
    completion = CompletionOutput(0, text, token_ids, "stop" if finished else None, None, logprobs)
    return RequestOutput("r", "p", [1, 2], [completion], finished=finished)


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA])
def test_a_listener_that_fell_behind_gets_what_it_missed_in_one_output(kind):
    """Three outputs wait when the listener looks: a delta listener gets them joined, a cumulative
    one the newest (which says it all)."""

    async def listen() -> list[RequestOutput]:
        streams = OutputStreams()
        added: Future = Future()
        added.set_result(None)
        outputs = streams.listen("r", lambda: added, lambda req_id: None, kind)
        if kind is RequestOutputKind.DELTA:
            sent = [_output("a", [1]), _output("bc", [2, 3]), _output("", [4], finished=True)]
        else:
            sent = [
                _output("a", [1]),
                _output("abc", [1, 2, 3]),
                _output("abc", [1, 2, 3, 4], True),
            ]
        first = asyncio.ensure_future(anext(outputs))
        await asyncio.sleep(0)  # the listener is registered and waits
        streams.deliver(sent)
        received = [await first]
        received += [output async for output in outputs]
        return received

    (received,) = asyncio.run(listen())
    assert received.finished and received.outputs[0].finish_reason == "stop"
    assert received.outputs[0].text == "abc"
    assert received.outputs[0].token_ids == [1, 2, 3, 4]
    assert [lp.token_id for lp in received.outputs[0].logprobs] == [1, 2, 3, 4]
