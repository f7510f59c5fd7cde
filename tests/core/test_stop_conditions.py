"""How requests end in the engine: stop strings (also across tokens), stop token ids, EOS,
max_tokens, context length."""

import pytest

from spyglass.core.engine.sampling_params import SamplingParams

PROMPTS = ["Hello world", "def f(x):\n    return x", "The weather today is", "1 2 3 4 5"]


@pytest.fixture(scope="module")
def engine(make_tiny_engine):
    return make_tiny_engine()


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_checkpoint):
    return tiny_llama_checkpoint.tokenizer


@pytest.fixture(scope="module")
def greedy_runs(engine, run_engine, tokenizer):
    """(prompt ids, greedy output ids) per prompt, 32 tokens each, ignoring EOS."""
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    outputs = run_engine(
        engine, prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    )
    return [(prompt, output.outputs[0].token_ids) for prompt, output in zip(prompts, outputs)]


def run_streaming(engine, prompt, params, req_id):
    """Step one request to its end; returns every output it produced."""
    engine.add_request(req_id, prompt, params)
    outputs = []
    while engine.has_unfinished_requests:
        outputs.extend(engine.step())
    return outputs


def spanning_stop(tokenizer, token_ids):
    """A 4-character stop string made of the last 2 characters of one token's text and the first 2 of the next's.

    Returns (stop, number of tokens up to the one completing it, text before it), choosing the first
    boundary where the string does not occur earlier in the text.
    """
    for i in range(1, len(token_ids) - 1):
        head, longer = tokenizer.decode(token_ids[:i]), tokenizer.decode(token_ids[: i + 1])
        if (
            "\ufffd" in longer
            or len(head) < 2
            or len(longer) < len(head) + 2
            or not longer.startswith(head)
        ):
            continue
        stop = longer[len(head) - 2 : len(head) + 2]
        if longer.find(stop) == len(head) - 2:
            return stop, i + 1, head[:-2]
    raise AssertionError("no clean token boundary in the greedy output")


def test_stop_string_spanning_two_tokens(engine, tokenizer, greedy_runs):
    for index, (prompt, full) in enumerate(greedy_runs):
        stop, num_tokens, before = spanning_stop(tokenizer, full)
        # Really spans a boundary: neither token's own text contains it.
        assert stop not in tokenizer.decode(full[num_tokens - 2 : num_tokens - 1])
        assert stop not in tokenizer.decode(full[num_tokens - 1 : num_tokens])
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, stop=[stop])
        outputs = run_streaming(engine, prompt, params, f"span-{index}")
        final = outputs[-1].outputs[0]
        assert outputs[-1].finished and (final.finish_reason, final.stop_reason) == ("stop", stop)
        assert final.text == before
        assert final.token_ids == full[:num_tokens]
        for output in outputs:
            assert before.startswith(output.outputs[0].text)


def test_stop_token_ids(engine, greedy_runs):
    prompt, full = greedy_runs[1]
    stop_token = full[5]
    position = full.index(stop_token)
    params = SamplingParams(
        temperature=0, max_tokens=32, ignore_eos=True, stop_token_ids=[123, stop_token]
    )
    final = run_streaming(engine, prompt, params, "stop-id")[-1].outputs[0]
    assert (final.finish_reason, final.stop_reason) == ("stop", stop_token)
    assert final.token_ids == full[: position + 1]
    assert final.text == engine.tokenizer.decode(full[:position])  # the stop token's text is not


def test_eos_finishes_unless_ignored(engine, greedy_runs):
    prompt, full = greedy_runs[2]
    eos = full[3]
    position = full.index(eos)
    request = engine.add_request("eos", prompt, SamplingParams(temperature=0, max_tokens=32))
    assert request.eos_token_ids == engine.tokenizer.eos_token_ids == (2,)
    # The random model never samples the real EOS; make one of its greedy tokens the EOS for this request.
    request.eos_token_ids = (eos,)
    ignored = engine.add_request(
        "no-eos", prompt, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    )
    assert ignored.eos_token_ids == ()
    finished = {}
    while engine.has_unfinished_requests:
        finished.update((o.request_id, o.outputs[0]) for o in engine.step() if o.finished)
    assert (finished["eos"].finish_reason, finished["eos"].stop_reason) == ("stop", None)
    assert finished["eos"].token_ids == full[: position + 1]
    assert (finished["no-eos"].finish_reason, finished["no-eos"].token_ids) == ("length", full)


def test_max_tokens_is_length(engine, run_engine, greedy_runs):
    prompt, full = greedy_runs[0]
    [output] = run_engine(
        engine, [prompt], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    )
    assert (output.outputs[0].finish_reason, output.outputs[0].token_ids) == ("length", full[:7])


def test_without_max_tokens_generation_stops_at_the_context_length(
    make_tiny_engine, run_engine, greedy_runs
):
    prompt, _ = greedy_runs[0]
    engine = make_tiny_engine(max_model_len=24)
    [output] = run_engine(
        engine, [prompt], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    )
    assert output.outputs[0].finish_reason == "length"
    assert len(prompt) + len(output.outputs[0].token_ids) == 24


def test_stop_string_in_a_batch_does_not_stop_the_others(
    engine, run_engine, tokenizer, greedy_runs
):
    stop, _, before = spanning_stop(tokenizer, greedy_runs[0][1])
    params = [
        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, stop=[stop]),
        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
    ]
    stopped, other = run_engine(engine, [greedy_runs[0][0], greedy_runs[1][0]], params)
    assert (stopped.outputs[0].text, stopped.outputs[0].finish_reason) == (before, "stop")
    assert (other.outputs[0].token_ids, other.outputs[0].finish_reason) == (
        greedy_runs[1][1],
        "length",
    )
