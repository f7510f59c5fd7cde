"""``spyglass bench steps``: where a decode step's time goes, per batch size.

For each batch size, that many requests of ``--prompt-len`` random tokens decode ``--max-tokens``
tokens together (greedy unless ``--sampling`` says otherwise, EOS ignored). Each decode step's time
is split into the engine's phases: schedule (`StepStats.schedule_time`), prepare (the runner
building the step's inputs), launch (the rest of `ModelRunner.launch`: the forward and sampling
queued), wait (`ModelRunner.collect`: the host waiting for the device's token ids) and update
(committing tokens, text, outputs and the step hooks: `StepStats.update_time`); deferred is
`ModelRunner.sample_deferred` (async scheduling's grammar steps: masks filled and sampling
queued once the step before is committed; 0 where no step defers). On the CPU the
model and the sampler run inside launch; on a GPU launch is the host's side of them and wait the
device's time that the host did not hide. Medians over the decode steps of each batch; ``step``
is the median wall time of an ``LLMEngine.step`` call; ``graphed`` the share of the decode steps
whose forward replayed a CUDA graph (`StepStats.forward`).

``--output-kinds`` runs each batch once per output kind (`RequestOutputKind`), one after the
other: a cumulative output copies each request's tokens so far at every step, which shows in
update as ``--max-tokens`` grows.
"""

import json
import statistics
import time

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    StructuredOutput,
)

PHASES = ("schedule", "prepare", "launch", "wait", "update", "deferred")
_KIND_NAMES = {kind.name.lower().replace("_", "-"): kind for kind in RequestOutputKind}


def add_parser(subparsers, argv) -> None:
    """Register ``bench steps``."""
    parser = subparsers.add_parser("steps", help="where a decode step's time goes, per batch size")
    parser.add_argument("--batches", default="1,64,256", help="comma-separated batch sizes")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--output-kinds",
        default="delta",
        help="comma-separated output kinds to run each batch with: "
        + ", ".join(_KIND_NAMES)
        + " (delta is what the HTTP API asks for)",
    )
    parser.add_argument(
        "--sampling",
        default="{}",
        help="sampling settings for every request, as JSON, e.g. "
        '\'{"temperature": 0.7, "top_p": 0.9}\' (default: greedy); a seed is offset by the '
        'request\'s index; a grammar is {"structured_output": {"kind": "json_object"}} (kind and '
        "value of `StructuredOutput`)",
    )
    add_engine_arguments(parser)
    parser.set_defaults(run=run)


class CallTimer:
    """Replaces ``owner.name`` with a wrapper that keeps each call's seconds."""

    def __init__(self, owner, name: str):
        self.seconds: list[float] = []
        method = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - start)

        setattr(owner, name, timed)


class DecodeSteps:
    """Keeps the schedule and update seconds of steps without prefill, and how their forwards ran."""

    def __init__(self):
        self.phases: dict[str, list[float]] = {"schedule": [], "update": []}
        self.forwards: list[str] = []

    @hookimpl
    def spyglass_step_finished(self, stats):
        """Keep a decode step's host phases and its forward."""
        if stats.num_prefill_reqs == 0:
            self.phases["schedule"].append(stats.schedule_time)
            self.phases["update"].append(stats.update_time)
            self.forwards.append(stats.forward)


def phase_medians(
    engine: LLMEngine,
    batch: int,
    prompt_len: int,
    max_tokens: int,
    kind: RequestOutputKind = RequestOutputKind.DELTA,
    sampling: dict | None = None,
) -> dict:
    """Median seconds of each phase, and of a whole step, over one batch's decode steps; and
    ``graphed``, the share of them that replayed a CUDA graph."""
    runner = engine.runner
    timed = ("prepare", "launch", "collect", "sample_deferred")
    timers = {name: CallTimer(runner, name) for name in timed}
    decode = DecodeSteps()
    engine.plugin_manager.register(decode)
    settings = {"temperature": 0.0, **(sampling or {})}
    vocab = engine.arch.vocab_size
    for index in range(batch):
        prompt = [(7919 * (index * prompt_len + i)) % vocab for i in range(prompt_len)]
        seed = settings.get("seed")
        params = SamplingParams(
            **{**settings, "seed": None if seed is None else seed + index},
            max_tokens=max_tokens,
            ignore_eos=True,
            output_kind=kind,
        )
        engine.add_request(f"steps-{batch}-{index}", prompt, params)
    calls = []
    while engine.has_unfinished_requests:
        start = time.perf_counter()
        engine.step()
        calls.append(time.perf_counter() - start)
    engine.plugin_manager.unregister(decode)
    for name in timers:
        del runner.__dict__[name]  # the class's methods again
    # The first calls hold the prompts (and one more with overlapped steps); the last, the drain.
    trim = slice(3, -2)
    launch = [lo - pr for lo, pr in zip(timers["launch"].seconds, timers["prepare"].seconds)]
    samples = {
        "step": calls[trim],
        "prepare": timers["prepare"].seconds[trim],
        "launch": launch[trim],
        "wait": timers["collect"].seconds[trim],
        "deferred": timers["sample_deferred"].seconds[trim] or [0.0],
        **decode.phases,
    }
    medians = {name: statistics.median(values) for name, values in samples.items()}
    graphed = sum(forward != "eager" for forward in decode.forwards)
    return medians | {"graphed": graphed / max(len(decode.forwards), 1)}


def sampling_settings(settings: dict) -> dict:
    """``--sampling``'s JSON as `SamplingParams` settings: a ``structured_output`` object made a
    `StructuredOutput`."""
    spec = settings.get("structured_output")
    if spec is None:
        return settings
    if not isinstance(spec, dict):
        raise ValueError('structured_output is an object: {"kind": ..., "value": ...}')
    return {**settings, "structured_output": StructuredOutput(**spec)}


def run(args) -> int:
    """One engine; each batch size in turn, with each output kind; print the table."""
    batches = [int(b) for b in args.batches.split(",") if b]
    names = [name for name in args.output_kinds.split(",") if name]
    unknown = [name for name in names if name not in _KIND_NAMES]
    if unknown or not names:
        print(f"--output-kinds takes {', '.join(_KIND_NAMES)}; got {args.output_kinds!r}")
        return 2
    try:
        sampling = sampling_settings(json.loads(args.sampling))
        SamplingParams(**sampling)
    except (TypeError, ValueError) as error:
        print(f"--sampling: {error}")
        return 2
    engine = LLMEngine(engine_config_from_args(args, max_num_seqs=max(batches)))
    info = engine.info
    print(
        f"model {engine.model_name} on {info.device}, {info.dtype}, async output "
        f"{'on' if engine.async_output else 'off'}, CUDA graphs "
        f"{'on' if engine.runner.graphs else 'off'}; {args.prompt_len}-token prompts, "
        f"{args.max_tokens} tokens, sampling {sampling or 'greedy'}, medians over the decode "
        "steps (ms)"
    )
    print(
        f"{'batch':>6}{'outputs':>12}{'step':>9}"
        + "".join(f"{p:>10}" for p in PHASES)
        + f"{'graphed':>9}"
    )
    for batch in batches:
        for name in names:
            medians = phase_medians(
                engine, batch, args.prompt_len, args.max_tokens, _KIND_NAMES[name], sampling
            )
            row = "".join(f"{medians[phase] * 1e3:>10.2f}" for phase in PHASES)
            graphed = f"{medians['graphed']:.0%}"
            print(f"{batch:>6}{name:>12}{medians['step'] * 1e3:>9.2f}{row}{graphed:>9}")
    engine.shutdown()
    return 0
