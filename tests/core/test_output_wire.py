"""The engine process's outputs cross its pipe as tuples and come back equal, without their prompts."""

import dataclasses
import pickle

from spyglass.core.engine.output_wire import from_wire, to_wire
from spyglass.core.engine.outputs import CompletionOutput, Logprob, RequestOutput


def test_outputs_come_back_equal_but_for_their_prompts():
    outputs = [
        RequestOutput(
            "a",
            "the prompt",
            [1, 2, 3],
            [CompletionOutput(0, " word", [1234], None, None, None)],
        ),
        RequestOutput(
            "b",
            None,
            [4],
            [
                CompletionOutput(
                    0, "x\ufffd", [5, 6], "stop", "</s>", [Logprob(5, -0.5, {5: -0.5, 7: -1.25})]
                ),
                CompletionOutput(1, "", [], "length", 2, []),
            ],
            finished=True,
            num_cached_tokens=16,
            metrics={"queue_s": 0.25},
            prompt_logprobs=[None, Logprob(4, -2.5, {9: -0.5}, rank=3)],
        ),
        RequestOutput(
            "c",
            None,
            [8, 9],
            [CompletionOutput(0, "", [], "stop")],
            finished=True,
            pooled=[0.6, -0.8],
        ),
    ]
    received = from_wire(pickle.loads(pickle.dumps(to_wire(outputs))))
    assert received == [dataclasses.replace(o, prompt=None, prompt_token_ids=[]) for o in outputs]
