"""``async_output``: a step's text, outputs and announcement come while the next step runs, and
change nothing else: the same tokens, texts and finishes, hooks in pairs, aborts mid-flight."""

import argparse
import dataclasses

import pytest

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.sampling_params import SamplingParams
from tests.core.conftest import completion_fields, with_stop_strings


class StepEvents:
    """A plugin that keeps the order of step announcements."""

    def __init__(self):
        self.events = []

    @hookimpl
    def spyglass_step_started(self, step_id, scheduled):
        """Keep the start."""
        self.events.append(("started", step_id))

    @hookimpl
    def spyglass_step_finished(self, stats):
        """Keep the finish."""
        self.events.append(("finished", stats.step_id))


@pytest.fixture(scope="module")
def prompts(tiny_llama_checkpoint, mixed_texts) -> list[list[int]]:
    return [tiny_llama_checkpoint.tokenizer.encode(text) for text in mixed_texts]


def test_the_same_outputs_as_stepping_in_turn(make_tiny_engine, run_engine, prompts):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    params = [
        greedy,
        dataclasses.replace(greedy, logprobs=2),
        SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=17, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=20, max_tokens=9, ignore_eos=True),
        dataclasses.replace(greedy, max_tokens=1),
    ]
    mixed = with_stop_strings(
        make_tiny_engine(async_output=False),
        prompts,
        [params[i % len(params)] for i in range(len(prompts))],
    )
    in_turn = run_engine(make_tiny_engine(async_output=False), prompts, mixed)
    overlapped = run_engine(make_tiny_engine(async_output=True), prompts, mixed)
    assert sum(o.outputs[0].stop_reason is not None for o in in_turn) >= 2
    assert [completion_fields(o) for o in overlapped] == [completion_fields(o) for o in in_turn]


@pytest.mark.parametrize("scheduling", [False, True], ids=["async output", "async scheduling"])
def test_steps_are_announced_in_pairs_and_an_abort_in_flight_is_final(
    make_tiny_engine, prompts, scheduling
):
    engine = make_tiny_engine(async_output=True, async_scheduling=scheduling)
    events = StepEvents()
    engine.plugin_manager.register(events)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for index, prompt in enumerate(prompts[:4]):
        engine.add_request(f"r{index}", prompt, params)
    outputs = [output for _ in range(3) for output in engine.step()]
    assert engine._in_flight is not None  # a launched step that r1 is part of
    aborted = engine.abort("r1")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    later = []
    while engine.has_unfinished_requests:
        later += engine.step()
        engine.kv.check_integrity()
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    assert all(o.request_id != "r1" for o in later)  # its abort was its last word
    finals = {o.request_id: o for o in outputs + later if o.finished}
    assert sorted(finals) == ["r0", "r2", "r3"]
    assert all(len(o.outputs[0].token_ids) == 12 for o in finals.values())
    # Every step starts, then finishes, before the next one starts.
    steps = [step_id for kind, step_id in events.events if kind == "started"]
    assert events.events == [(kind, s) for s in steps for kind in ("started", "finished")]


def test_the_flag_and_its_default():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    for argv, value in (["--async-output"], True), (["--no-async-output"], False), ([], None):
        assert engine_config_from_args(parser.parse_args(argv)).async_output is value
