"""Prompt logprobs (``SamplingParams.prompt_logprobs``) on the default model against transformers,
through chunked prefill, preemption, the prefix cache and every output kind."""

from dataclasses import replace

import pytest
import torch

from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    RequestOutputKind,
    SamplingParams,
)

SCORED = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=3)


@pytest.fixture(scope="module")
def prompts(default_prompts):
    return default_prompts


@pytest.fixture(scope="module")
def reference(hf_default_model, prompts):
    """transformers' log-softmax over each prompt position's logits."""
    with torch.inference_mode():
        return [
            hf_default_model(torch.tensor([p])).logits[0].float().log_softmax(dim=-1)
            for p in prompts
        ]


def _check(output, prompt, logprobs):
    scored = output.prompt_logprobs
    assert len(scored) == len(prompt) and scored[0] is None
    for position, lp in enumerate(scored[1:], start=1):
        row = logprobs[position - 1]  # the logits before a token score it
        assert lp.token_id == prompt[position]
        assert lp.logprob == pytest.approx(float(row[prompt[position]]), abs=1e-3)
        # The rank-th most likely token has the token's logprob (a near-tie may swap neighbours).
        assert float(row.topk(lp.rank).values[-1]) == pytest.approx(lp.logprob, abs=1e-3)
        top_values = row.topk(3).values
        assert list(lp.top.values()) == pytest.approx(top_values.tolist(), abs=1e-3)
        assert set(lp.top) <= set(row.topk(6).indices.tolist())


@pytest.mark.parametrize("options", [{}, {"async_scheduling": True}], ids=["sync", "async"])
def test_prompt_logprobs_match_transformers(
    make_default_engine, run_engine, prompts, reference, options
):
    # A plain request decodes alongside, so async steps are planned ahead while prompts are scored.
    plain_params = replace(SCORED, prompt_logprobs=None, max_tokens=24)
    *outputs, alongside = run_engine(
        make_default_engine(**options), [*prompts, prompts[0]], [SCORED] * 3 + [plain_params]
    )
    assert alongside.prompt_logprobs is None and len(alongside.outputs[0].token_ids) == 24
    for output, prompt, logprobs in zip(outputs, prompts, reference, strict=True):
        _check(output, prompt, logprobs)
    # The tokens generated after the prompt are the same as without scoring it.
    plain = run_engine(make_default_engine(), prompts, replace(SCORED, prompt_logprobs=None))
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in plain]
    assert all(o.prompt_logprobs is None for o in plain)


class LaunchesAfterScoring:
    """Counts the runner's launches made while a step that scores prompt tokens is in flight."""

    def __init__(self, engine):
        self.count = 0
        launch = engine.runner.launch

        def counted(out, block_tables, after=None):
            self.count += after is not None and after.prompt_scores is not None
            return launch(out, block_tables, after)

        engine.runner.launch = counted


@pytest.mark.parametrize("options", [{}, {"async_scheduling": True}], ids=["sync", "async"])
def test_chunks_preemption_and_the_prefix_cache_score_every_position_once(
    make_cramped_engine, run_engine, prompts, reference, count_preemptions, options
):
    """With async scheduling, the next chunk is planned while a chunk's scores are on their way to
    the host: its first row comes from the positions, not the scores committed so far."""
    engine = make_cramped_engine(**options)
    preemptions = count_preemptions(engine)
    launches = LaunchesAfterScoring(engine)
    run_engine(engine, prompts, replace(SCORED, prompt_logprobs=None))  # fills the cache
    preemptions.req_ids.clear()
    longer = replace(SCORED, max_tokens=24)
    outputs = run_engine(engine, prompts, longer)
    assert preemptions.req_ids, "the KV budget was meant to force preemptions"
    assert (launches.count > 0) == bool(options)
    for output, prompt, logprobs in zip(outputs, prompts, reference):
        assert output.num_cached_tokens == 0
        _check(output, prompt, logprobs)


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_every_output_kind_carries_them(make_default_engine, prompts, reference, kind):
    engine = make_default_engine()
    engine.add_request("kinds", prompts[0], replace(SCORED, max_tokens=4, output_kind=kind))
    outputs = []
    while engine.has_unfinished_requests:
        outputs += engine.step()
    carrying = [o for o in outputs if o.prompt_logprobs is not None]
    if kind is RequestOutputKind.CUMULATIVE:
        assert len(carrying) == len(outputs) == 4
    else:  # the first output for deltas, the only one for final-only
        assert carrying == outputs[:1]
    _check(carrying[0], prompts[0], reference[0])


def test_out_of_range_prompt_logprobs_are_refused():
    with pytest.raises(InvalidRequestError) as error:
        SamplingParams(prompt_logprobs=21)
    assert error.value.param == "prompt_logprobs"
