"""Predicted outputs (OpenAI's ``prediction``, `SamplingParams.prediction`): n-gram speculation
drafts from the prediction first. The tokens are those of a run without it, whatever it predicts;
a good prediction takes far fewer steps; where it would change nothing it is refused."""

import random

import pytest

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.plugins.ngram import propose_from_prediction

PROMPT = list(range(200, 240))
MAX_TOKENS = 48


def _prediction_by_slices(output: list[int], prediction: list[int], k: int) -> list[int]:
    """The definition, spelled out: the longest output suffix (4 tokens down to 1) found in the
    prediction with a token after it; of its matches, the one ending nearest len(output)."""
    for n in range(min(4, len(output)), 0, -1):
        ends = [
            start + n
            for start in range(len(prediction) - n)
            if prediction[start : start + n] == output[-n:]
        ]
        if ends:
            end = min(reversed(ends), key=lambda e: abs(e - len(output)))
            return prediction[end : end + k]
    return []


def test_a_prediction_drafts_what_follows_the_output_where_the_output_is():
    line = [7, 8, 9]
    prediction = line + [1, 2] + line + [3, 4] + line + [5, 6]
    # The output has reached the second copy of the line: drafts follow that copy, not the first
    # or the last.
    assert propose_from_prediction(line + [1, 2] + line, prediction, 3) == [3, 4, 7]
    assert propose_from_prediction(line, prediction, 2) == [1, 2]
    # Any match drafts all it may (the prediction is meant to be copied), a miss nothing.
    assert propose_from_prediction([42, 2], prediction, 8) == line + [3, 4, 7, 8, 9]
    assert propose_from_prediction([42], prediction, 3) == []
    assert propose_from_prediction([6], prediction, 3) == []  # nothing after it to draft


def test_prediction_search_equals_the_definition_on_random_outputs():
    rng = random.Random(0)
    for _ in range(3000):
        vocab = rng.choice([2, 3, 7, 300, 70_000])
        prediction = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        k = rng.randint(1, 6)
        expected = _prediction_by_slices(output, prediction, k)
        assert propose_from_prediction(output, prediction, k) == expected, (output, prediction)


def _engine(model, speculative="ngram") -> LLMEngine:
    config = EngineConfig(
        model=model,
        dtype="float32",
        speculative=speculative,
        num_speculative_tokens=4,
        num_kv_blocks=64,
        block_size=8,
    )
    return LLMEngine(config)


def _greedy(prediction=None, **options) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, prediction=prediction, **options
    )


def _run(engine: LLMEngine, params: SamplingParams) -> tuple[list[int], int]:
    """One request's tokens and the steps it took."""
    engine.add_request("r", PROMPT, params)
    steps, final = 0, None
    while engine.has_unfinished_requests:
        steps += 1
        for output in engine.step():
            if output.finished:
                final = output
    engine.kv.check_integrity()
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    # Every step gave one token beside the drafts it accepted, as the final output counts them.
    tokens = final.outputs[0].token_ids
    assert len(tokens) == steps + final.metrics.get("num_accepted_tokens", 0)
    assert final.metrics.get("num_draft_tokens", 0) >= final.metrics.get("num_accepted_tokens", 0)
    return tokens, steps


def test_the_tokens_are_the_same_whatever_the_prediction_and_a_good_one_saves_steps(
    tiny_llama_dir,
):
    engine = _engine(str(tiny_llama_dir))
    reference, plain_steps = _run(engine, _greedy())
    exact, exact_steps = _run(engine, _greedy(reference))
    # An edit in the middle: the drafts realign after it.
    edited = reference[:20] + [5, 6, 7] + reference[23:]
    after_edit, edited_steps = _run(engine, _greedy(edited))
    rng = random.Random(1)
    wrong, _ = _run(engine, _greedy([rng.randrange(1000, 2000) for _ in range(MAX_TOKENS)]))
    assert exact == after_edit == wrong == reference
    # Up to 5 tokens a step where the prediction holds (4 drafts and the verified one).
    assert exact_steps <= plain_steps // 3
    assert exact_steps < edited_steps < plain_steps // 2


def test_a_prediction_that_would_change_nothing_is_refused(tiny_llama_dir):
    plain = _engine(str(tiny_llama_dir), speculative=None)
    speculating = _engine(str(tiny_llama_dir))
    refused = [
        (plain, _greedy([1, 2, 3]), "--speculative ngram"),
        (speculating, _greedy([1, 2, 3], logprobs=1), "logprobs"),
        (speculating, _greedy([1, 2, 3], presence_penalty=0.5), "penalties"),
        (speculating, _greedy([1, 2, 3], speculative=False), "speculative=false"),
        (speculating, _greedy([1, 10**9]), "outside the vocabulary"),
    ]
    for engine, params, reason in refused:
        with pytest.raises(InvalidRequestError, match=reason) as error:
            engine.add_request("r", PROMPT, params)
        assert error.value.param == "prediction"
        assert not engine.requests
    with pytest.raises(InvalidRequestError, match="prediction must not be empty"):
        _greedy([])
