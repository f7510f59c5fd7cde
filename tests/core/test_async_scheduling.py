"""``async_scheduling``: each step is scheduled and launched before the previous one's tokens reach
the host (pending tokens read on the device). It changes no token, text or finish, falls back to
in-turn scheduling where a request needs its last token on the host, keeps every block accounted
for through preemptions and aborts, and never lets a request pass its ``max_tokens``."""

import argparse
import dataclasses
import re

import pytest
import torch

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import (
    SamplingParams,
    StructuredOutput,
    pooling_request_params,
)
from spyglass.core.engine.token_constraint import TokenConstraint
from tests.core.conftest import completion_fields


@pytest.fixture(scope="module")
def prompts(tiny_llama_checkpoint, mixed_texts) -> list[list[int]]:
    return [tiny_llama_checkpoint.tokenizer.encode(text) for text in mixed_texts]


class InFlightPreemptions:
    """Counts preemptions of requests whose last step was still in flight."""

    def __init__(self):
        self.count = 0

    @hookimpl
    def spyglass_request_preempted(self, request):
        """Count it if a launched step still computes for it."""
        self.count += request.num_in_flight_tokens > 0


class LaunchesAhead:
    """Counts the runner's launches, and those made while another step was in flight."""

    def __init__(self, engine):
        self.total = self.ahead = 0
        launch = engine.runner.launch

        def counted(out, block_tables, after=None):
            self.total += 1
            self.ahead += after is not None
            return launch(out, block_tables, after)

        engine.runner.launch = counted


def _ahead_engine(make_tiny_engine, **options):
    engine = make_tiny_engine(async_output=True, async_scheduling=True, **options)
    return engine, LaunchesAhead(engine)


def test_the_same_outputs_as_stepping_in_turn(make_tiny_engine, run_engine, prompts):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    params = [
        greedy,
        SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=17, ignore_eos=True),
        dataclasses.replace(greedy, max_tokens=1),
        dataclasses.replace(greedy, max_tokens=2),
        SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=9, ignore_eos=True),
        dataclasses.replace(greedy, logit_bias={17: 3.0}),
    ]
    mixed = [params[i % len(params)] for i in range(len(prompts))]
    first = run_engine(make_tiny_engine(async_output=False), prompts, mixed)
    # Stop strings and stop tokens taken from the first run end requests part-way, at a commit
    # that the next step was already scheduled past.
    for index, output in enumerate(first):
        completion = output.outputs[0]
        if index % 3 == 0 and len(completion.text) > 12:
            mixed[index] = dataclasses.replace(mixed[index], stop=[completion.text[8:11]])
        elif index % 3 == 1 and len(completion.token_ids) > 6:
            mixed[index] = dataclasses.replace(
                mixed[index], stop_token_ids=[completion.token_ids[5]]
            )
    in_turn = run_engine(make_tiny_engine(async_output=False), prompts, mixed)
    engine, launches = _ahead_engine(make_tiny_engine)
    ahead = run_engine(engine, prompts, mixed)
    assert sum(o.outputs[0].stop_reason is not None for o in in_turn) >= 4
    assert [completion_fields(o) for o in ahead] == [completion_fields(o) for o in in_turn]
    assert launches.ahead > launches.total // 2
    assert all(
        r.num_in_flight_tokens == r.num_pending_tokens == 0 for r in engine.requests.values()
    )


def test_penalties_min_tokens_and_logprobs_schedule_ahead(
    make_tiny_engine, run_engine, prompts, tiny_llama_checkpoint
):
    """A step sampled ahead counts the token its request sampled in the step still in flight. A
    logit bias makes the model repeat a few tokens, so the penalties decide every token, and a
    pending token left out (or counted twice) shows; EOS biased up ends a request the step after
    ``min_tokens``, which counts the pending token too. Logprobs reach the host with the tokens."""
    favourites = {17: 6.0, 29: 5.5, 31: 5.0, 43: 4.5}
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logit_bias=favourites)
    (eos,) = tiny_llama_checkpoint.tokenizer.eos_token_ids[:1]
    penalised = [
        dataclasses.replace(greedy, repetition_penalty=1.8),
        dataclasses.replace(greedy, frequency_penalty=0.7),
        dataclasses.replace(greedy, presence_penalty=2.0, repetition_penalty=0.9),
        dataclasses.replace(greedy, temperature=0.7, seed=4, frequency_penalty=0.4, logprobs=3),
        dataclasses.replace(greedy, logprobs=0, logit_bias=None),
        SamplingParams(temperature=0, max_tokens=24, min_tokens=9, logit_bias={eos: 30.0}),
    ]
    mixed = [penalised[i % len(penalised)] for i in range(len(prompts))]
    in_turn = run_engine(make_tiny_engine(async_output=False), prompts, mixed)
    engine, launches = _ahead_engine(make_tiny_engine)
    ahead = run_engine(engine, prompts, mixed)
    assert [completion_fields(o) for o in ahead] == [completion_fields(o) for o in in_turn]
    assert launches.ahead > launches.total // 2
    for output, params in zip(in_turn, mixed):
        tokens = output.outputs[0].token_ids
        if params.min_tokens:
            assert len(tokens) == 10 and tokens[-1] == eos
        elif params.has_penalties and params.temperature == 0:
            assert tokens[:2] == [17, 29]  # the second, sampled ahead, saw the first's penalty
        if params.logprobs is not None:
            logprobs = output.outputs[0].logprobs
            assert len(logprobs) == len(tokens)
            assert all(len(lp.top) == params.logprobs for lp in logprobs)


def test_bad_words_schedule_ahead(make_tiny_engine, run_engine, prompts, tiny_llama_checkpoint):
    """A bad word whose next-to-last token may be the pending one is banned on the device when that
    token is it: the same outputs as in turn, with two- and three-token words taken from the
    greedy outputs (so each bites), and a token that one word bans always and another only after
    a pending token."""
    tokenizer = tiny_llama_checkpoint.tokenizer
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    reference = run_engine(make_tiny_engine(async_output=False), prompts, greedy)
    params = []
    for output in reference:
        ids = output.outputs[0].token_ids
        words = [
            tokenizer.decode(ids[3:5]),
            tokenizer.decode(ids[8:11]),
            tokenizer.decode(ids[12:13]),
        ]
        words.append(tokenizer.decode([ids[11], ids[12]]))  # ends with the one-token word
        params.append(dataclasses.replace(greedy, bad_words=[w.strip() or "x" for w in words]))
    in_turn = run_engine(make_tiny_engine(async_output=False), prompts, params)
    engine, launches = _ahead_engine(make_tiny_engine)
    ahead = run_engine(engine, prompts, params)
    assert [completion_fields(o) for o in ahead] == [completion_fields(o) for o in in_turn]
    assert launches.ahead > launches.total // 2
    changed = [a.outputs[0].token_ids != r.outputs[0].token_ids for a, r in zip(ahead, reference)]
    assert sum(changed) >= len(prompts) // 2  # the words did ban tokens


def test_grammars_sample_after_the_commit_before(make_tiny_engine, run_engine, prompts):
    """A step that samples a grammar's token is forwarded ahead, and sampled once the step before
    is committed (the grammar has accepted the pending token): the same outputs as in turn, every
    one matching its grammar, greedy and drawn, beside plain requests; a grammar that ends its
    request mid-run (the commit finishes it) leaves its row of the step ahead unmasked."""
    digits = StructuredOutput("regex", "[0-9]{2,30}")
    short = StructuredOutput("choice", ["yes", "no"])
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    kinds = [
        dataclasses.replace(greedy, structured_output=digits),
        SamplingParams(temperature=0.9, seed=5, max_tokens=12, structured_output=digits),
        dataclasses.replace(greedy, structured_output=short, ignore_eos=False),
        greedy,
    ]
    mixed = [kinds[i % len(kinds)] for i in range(len(prompts))]
    plugins = ["fcfs", "structured_output"]
    in_turn = run_engine(make_tiny_engine(async_output=False, plugins=plugins), prompts, mixed)
    engine, launches = _ahead_engine(make_tiny_engine, plugins=plugins)
    sample_deferred, deferred = engine.runner.sample_deferred, []
    engine.runner.sample_deferred = lambda launched: deferred.append(1) or sample_deferred(launched)
    ahead = run_engine(engine, prompts, mixed)
    assert [completion_fields(o) for o in ahead] == [completion_fields(o) for o in in_turn]
    assert launches.ahead > launches.total // 2 and len(deferred) > launches.ahead // 2
    for output, params in zip(ahead, mixed):
        text = output.outputs[0].text
        if params.structured_output is digits:
            assert re.fullmatch("[0-9]{2,30}", text)
        elif params.structured_output is short:
            assert text in ("yes", "no") and output.outputs[0].finish_reason == "stop"


def _scores(output) -> list | None:
    """A request's prompt logprobs as (token, logprob, rank, top alternatives)."""
    if output.prompt_logprobs is None:
        return None
    return [
        None if lp is None else (lp.token_id, lp.logprob, lp.rank, lp.top)
        for lp in output.prompt_logprobs
    ]


DIGITS = StructuredOutput("regex", "[0-9]{2,12}")
EVERY_KIND = [
    SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.4, logit_bias={17: 4.0}
    ),
    SamplingParams(temperature=0.8, seed=9, max_tokens=9, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, structured_output=DIGITS),
    SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=2),
    pooling_request_params(PoolingParams(normalize=False)),
]
"""Penalties, logprobs, a grammar, prompt logprobs and an embedding."""

EVERY_KIND_OPTIONS = dict(
    plugins=["fcfs", "structured_output"], pooling_type="mean", max_num_batched_tokens=16
)
"""Mean pooling (every prompt position) and chunks of 16 tokens."""


def test_every_kind_of_request_at_once_is_planned_ahead(make_tiny_engine, run_engine, prompts):
    """`EVERY_KIND` side by side, in chunks of 16 tokens: with async scheduling every step but the
    first is launched while the one before is in flight, and every output is what stepping in turn
    gives."""
    mixed = [EVERY_KIND[i % len(EVERY_KIND)] for i in range(len(prompts))]
    in_turn = run_engine(make_tiny_engine(async_output=False, **EVERY_KIND_OPTIONS), prompts, mixed)
    engine, launches = _ahead_engine(make_tiny_engine, **EVERY_KIND_OPTIONS)
    ahead = run_engine(engine, prompts, mixed)
    assert launches.ahead == launches.total - 1
    for expected, actual in zip(in_turn, ahead, strict=True):
        assert completion_fields(actual) == completion_fields(expected)
        assert _scores(actual) == _scores(expected)
        assert actual.pooled == expected.pooled
    assert sum(o.pooled is not None for o in ahead) == mixed.count(EVERY_KIND[4])
    assert sum(o.prompt_logprobs is not None for o in ahead) == mixed.count(EVERY_KIND[3])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_kind_planned_ahead_on_a_gpu_scores_and_pools_as_the_cpu(
    make_tiny_engine, run_engine, prompts
):
    """On CUDA (graphs, pinned copies, events) the scores and vectors that travel to the host with
    a step's tokens are the CPU's, and every request ends as its settings say. Tokens are not
    compared: the random model's near-uniform logits let the two devices' rounding part them."""
    mixed = [EVERY_KIND[i % len(EVERY_KIND)] for i in range(len(prompts))]
    on_cpu = run_engine(make_tiny_engine(async_output=False, **EVERY_KIND_OPTIONS), prompts, mixed)
    engine, launches = _ahead_engine(make_tiny_engine, device="cuda", **EVERY_KIND_OPTIONS)
    on_gpu = run_engine(engine, prompts, mixed)
    assert launches.ahead == launches.total - 1
    for expected, actual, params in zip(on_cpu, on_gpu, mixed, strict=True):
        if params.pooling is not None:
            # Within the rounding of Triton's TF32 dots in float32 attention; a row mixed up is O(1).
            torch.testing.assert_close(
                torch.tensor(actual.pooled), torch.tensor(expected.pooled), atol=2e-3, rtol=0
            )
            continue
        if params.prompt_logprobs is not None:
            got, want = _scores(actual)[1:], _scores(expected)[1:]
            assert [g[0] for g in got] == [w[0] for w in want]  # the prompt's tokens
            assert [g[1] for g in got] == pytest.approx([w[1] for w in want], abs=2e-3)
        completion = actual.outputs[0]
        assert len(completion.token_ids) == params.max_tokens or params.structured_output
        if params.structured_output is not None:
            assert re.fullmatch("[0-9]{2,12}", completion.text)
        if params.logprobs is not None:
            assert len(completion.logprobs) == len(completion.token_ids)


class OpenUntilEos(TokenConstraint):
    """Allows every token; notes each mask it is asked for after accepting EOS (its request over)."""

    def __init__(self, eos: int, late_fills: list[int]):
        self.eos, self.late_fills, self.ended = eos, late_fills, False

    def fill_bitmask(self, bitmask, row):
        self.late_fills += [row] * self.ended
        bitmask[row] = -1

    def accept(self, token_id):
        self.ended = token_id == self.eos
        return True

    def num_valid(self, token_ids):
        return len(token_ids)


class OpenGrammars:
    """Gives every structured-output request an `OpenUntilEos`."""

    def __init__(self, eos: int):
        self.eos, self.late_fills = eos, []

    @hookimpl
    def spyglass_token_constraint(self, spec, tokenizer, vocab_size):
        """An `OpenUntilEos`, whatever ``spec`` says."""
        return OpenUntilEos(self.eos, self.late_fills)


def test_a_grammar_is_not_asked_for_a_mask_after_its_request_ends(
    make_tiny_engine, run_engine, prompts, tiny_llama_checkpoint
):
    """A request that the commit before a deferred sampling finished still has its row in the step
    ahead: its grammar is not asked for that row's mask."""
    (eos,) = tiny_llama_checkpoint.tokenizer.eos_token_ids[:1]
    grammars = OpenGrammars(eos)
    engine, launches = _ahead_engine(make_tiny_engine, plugins=["fcfs"])
    engine.plugin_manager.register(grammars)
    ends = SamplingParams(
        temperature=0,
        max_tokens=20,
        min_tokens=3,
        logit_bias={eos: 30.0},
        structured_output=StructuredOutput("regex", ".*"),
    )
    runs_on = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    outputs = run_engine(engine, prompts[:4], [ends, runs_on, ends, runs_on])
    assert [len(o.outputs[0].token_ids) for o in outputs] == [4, 20, 4, 20]
    assert launches.ahead > 10 and grammars.late_fills == []


def test_preemption_while_a_step_is_in_flight(make_tiny_engine, run_engine, prompts, same_greedy):
    """A pool too small for the batch: requests are preempted while their previous step runs, and
    come back with the token that step sampled."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    with_logprobs = dataclasses.replace(params, logprobs=2)  # for near-ties (same_greedy)
    reference = run_engine(make_tiny_engine(async_output=False), prompts, with_logprobs)
    engine, launches = _ahead_engine(make_tiny_engine, num_kv_blocks=24, max_num_seqs=16)
    preemptions = InFlightPreemptions()
    engine.plugin_manager.register(preemptions)
    ahead = run_engine(engine, prompts, params)  # checks the pool's integrity after every step
    assert preemptions.count >= 3 and launches.ahead > 0
    for expected, actual in zip(reference, ahead):
        assert len(actual.outputs[0].token_ids) == 40
        same_greedy(expected, actual)


def test_the_flag_and_what_it_does_not_combine_with(make_tiny_engine):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["--async-scheduling"])).async_scheduling
    assert engine_config_from_args(parser.parse_args([])).async_scheduling is None
    refused = engine_config_from_args(parser.parse_args(["--no-async-scheduling"]))
    assert refused.async_scheduling is False
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    # The default: both on with CUDA for one process without speculation, both off on the CPU.
    assert EngineConfig().async_modes(cuda) == (True, True)
    assert EngineConfig().async_modes(cpu) == (False, False)
    assert refused.async_modes(cuda) == (True, False)
    assert EngineConfig(async_output=False).async_modes(cuda) == (False, False)
    assert EngineConfig(speculative="ngram").async_modes(cuda) == (True, False)
    assert EngineConfig(tensor_parallel_size=2).async_modes(cuda) == (True, False)
    assert make_tiny_engine(async_scheduling=True).async_output  # brought along on the CPU too
    with pytest.raises(ValueError, match="needs async output"):
        make_tiny_engine(async_output=False, async_scheduling=True)
    with pytest.raises(ValueError, match="does not combine with --speculative"):
        make_tiny_engine(
            async_output=True, async_scheduling=True, speculative="ngram", plugins=["fcfs", "ngram"]
        )


def test_a_step_that_fails_on_the_device_drops_the_step_ahead(
    make_tiny_engine, run_engine, prompts
):
    """A device error surfaces when a step's ids are collected, after the next step was launched
    on them: that step is dropped uncommitted, the failed one rerun a request at a time."""
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = run_engine(make_tiny_engine(async_output=False), prompts[:5], params)
    engine, launches = _ahead_engine(make_tiny_engine)
    collect, calls = engine.runner.collect, []

    def failing_once(launched):
        calls.append(launched)
        if len(calls) == 4:
            raise RuntimeError("device-side assert")
        return collect(launched)

    engine.runner.collect = failing_once
    outputs = run_engine(engine, prompts[:5], params)
    assert len(calls) > 4 and launches.ahead > 0
    assert [completion_fields(o) for o in outputs] == [completion_fields(o) for o in expected]
