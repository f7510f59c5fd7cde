"""Outputs sent as differences rebuild exactly the cumulative outputs the engine made."""

import pickle

from spyglass.core.engine.output_deltas import DeltaDecoder, DeltaEncoder
from spyglass.core.engine.outputs import CompletionOutput, Logprob, RequestOutput
from spyglass.core.engine.sampling_params import SamplingParams


def _output(text, token_ids, finished=False, logprobs=None, reason=None) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        prompt="a prompt",
        prompt_token_ids=[1, 2, 3],
        outputs=[CompletionOutput(0, text, token_ids, reason, None, logprobs)],
        finished=finished,
        num_cached_tokens=2,
        metrics={"ttft": 0.5} if finished else {},
    )


def _round_trip(outputs: list[RequestOutput]) -> tuple[list[RequestOutput], list]:
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    deltas = [pickle.loads(pickle.dumps(encoder.encode(o))) for o in outputs]
    return [decoder.decode(d) for d in deltas], deltas


def test_a_growing_output_travels_as_tails_and_comes_back_whole():
    lp = [Logprob(i, -0.1 * i, {i: -0.1 * i}) for i in range(4)]
    outputs = [
        _output("He", [5], logprobs=lp[:1]),
        _output("Hello", [5, 6], logprobs=lp[:2]),
        _output("Hello wor", [5, 6, 7], logprobs=lp[:3]),
        _output("Hello world", [5, 6, 7, 8], finished=True, logprobs=lp, reason="stop"),
    ]
    rebuilt, deltas = _round_trip(outputs)
    assert rebuilt == outputs
    assert deltas[0].prompt_token_ids == [1, 2, 3] and deltas[1].prompt_token_ids is None
    assert [(d.completions[0].text_tail, d.completions[0].token_tail) for d in deltas[1:]] == [
        ("llo", [6]),
        (" wor", [7]),
        ("ld", [8]),
    ]


def test_text_that_shrinks_is_rewritten_from_where_it_differs():
    # A stop string found at the end cuts text that an earlier output showed.
    outputs = [_output("Hello ST", [5, 6]), _output("Hello", [5, 6, 7], finished=True)]
    rebuilt, deltas = _round_trip(outputs)
    assert rebuilt == outputs
    assert (deltas[1].completions[0].text_kept, deltas[1].completions[0].text_tail) == (5, "")


def test_finished_and_forgotten_requests_leave_no_state():
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    decoder.decode(encoder.encode(_output("a", [1])))
    assert len(decoder) == 1
    decoder.decode(encoder.encode(_output("ab", [1, 2], finished=True)))
    assert len(decoder) == 0
    decoder.decode(encoder.encode(_output("a", [1])))
    later = encoder.encode(_output("ab", [1, 2]))
    decoder.forget("r")  # the listener went away: what still comes for it is dropped
    assert decoder.decode(later) is None and len(decoder) == 0
    encoder.forget("r")
    assert encoder.encode(_output("abc", [1, 2, 3])).prompt_token_ids == [1, 2, 3]


def test_what_crosses_the_pipe_pickles(default_checkpoint):
    tokenizer = pickle.loads(pickle.dumps(default_checkpoint.tokenizer))
    text = "Hello, lighthouse keepers!"
    assert tokenizer.encode(text) == default_checkpoint.tokenizer.encode(text)
    assert tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    ) == default_checkpoint.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    params = SamplingParams(temperature=0.5, max_tokens=9, stop=["\n"], seed=3)
    assert pickle.loads(pickle.dumps(params)) == params
