"""The engine's process builds its outputs as wire rows (`LLMEngine.send_wire_outputs`): through its
pipe they come back equal to the `RequestOutput`s another engine gives, without their prompts."""

import dataclasses
import pickle

from spyglass.core.engine.output_wire import from_wire
from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    pooling_request_params,
)


def _every_output(engine, prompts, params) -> list:
    """Every output of every step, abort included, in order."""
    for index, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{index}", prompt, p)
    outputs = []
    for _ in range(3):
        outputs += engine.step()
    outputs += [engine.abort("r0")]  # a running request aborted: its final output
    while engine.has_unfinished_requests:
        outputs += engine.step()
    return outputs


def test_wire_outputs_come_back_equal_but_for_their_prompts(
    make_tiny_engine, tiny_llama_checkpoint
):
    tokenizer = tiny_llama_checkpoint.tokenizer
    prompts = [tokenizer.encode(t) for t in ("Hi there", "One, two, three", "The fox", "A", "B c")]
    params = [
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        SamplingParams(
            temperature=0,
            max_tokens=8,
            logprobs=2,
            prompt_logprobs=1,
            output_kind=RequestOutputKind.DELTA,
        ),
        SamplingParams(
            temperature=0.8,
            seed=1,
            max_tokens=40,
            min_tokens=3,
            stop_token_ids=[17],
            logit_bias={17: 30.0},
        ),
        pooling_request_params(PoolingParams()),
        SamplingParams(temperature=0, max_tokens=5, output_kind=RequestOutputKind.FINAL_ONLY),
    ]
    expected = _every_output(make_tiny_engine(), prompts, params)
    wired = make_tiny_engine()
    wired.send_wire_outputs()
    rows = _every_output(wired, prompts, params)
    assert all(type(row) is tuple for row in rows)
    received = from_wire(pickle.loads(pickle.dumps(rows)))
    assert received == [dataclasses.replace(o, prompt=None, prompt_token_ids=[]) for o in expected]
    kinds = {
        "logprobs": any(o.outputs[0].logprobs for o in received),
        "prompt logprobs": any(o.prompt_logprobs for o in received),
        "pooled": any(o.pooled for o in received),
        "aborted": any(o.outputs[0].finish_reason == "abort" for o in received),
        "stopped": any(o.outputs[0].stop_reason == 17 for o in received),
    }
    assert all(kinds.values()), kinds
