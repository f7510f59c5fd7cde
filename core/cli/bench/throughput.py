"""``spyglass bench throughput``: offline throughput on W1 and W3, optionally against HF static batching.

``--compare-schema`` adds a configuration in which every request is constrained by a JSON schema
(`BENCH_SCHEMA`, which cannot close before the output length, so both sides generate the same
tokens); its ratio to the baseline is the cost of structured output. ``--compare-lora 1,4`` adds a
configuration per count, in which the requests take turns over that many random rank
``--max-lora-rank`` adapters on every projection (`random_lora`): the cost of LoRA serving.

Every configuration runs ``--repeats`` times, interleaved, and the median is reported, so a
machine-wide slowdown hits all configurations alike and the printed ratios stay meaningful.
"""

import dataclasses
import gc
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from spyglass.core.cli.bench.hf_static import HFStaticBatching
from spyglass.core.cli.bench.random_lora import write_random_lora
from spyglass.core.cli.bench.results import RunResult
from spyglass.core.cli.bench.span_sink import sink_tracer_provider
from spyglass.core.cli.bench.workloads import WORKLOADS, BenchRequest
from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    StructuredOutput,
)
from spyglass.telemetry import tracing
from spyglass.telemetry.cli_options import add_telemetry_arguments, settings_from_args


def add_parser(subparsers, argv) -> None:
    """Register ``bench throughput``."""
    parser = subparsers.add_parser("throughput", help="offline throughput on W1 / W3")
    parser.add_argument("--workloads", default="w1,w3", help="comma-separated: w1, w3")
    parser.add_argument(
        "--num-requests", type=int, default=None, help="override the workload's request count"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compare-hf", action="store_true", help="also time HF transformers static batching on W1"
    )
    parser.add_argument(
        "--compare-policies",
        default="",
        help="comma-separated scheduling policies to run beside --policy",
    )
    parser.add_argument(
        "--compare-schema",
        action="store_true",
        help="also run every request constrained by a JSON schema",
    )
    parser.add_argument(
        "--compare-telemetry",
        default="",
        help="comma-separated telemetry levels (off, metrics, full) to run beside --telemetry",
    )
    parser.add_argument(
        "--compare-tensor-parallel",
        default="",
        help="comma-separated tensor-parallel sizes to run beside --tensor-parallel-size, e.g. 2",
    )
    parser.add_argument(
        "--compare-lora",
        default="",
        help="comma-separated adapter counts to run with LoRA (random adapters of --max-lora-rank)",
    )
    add_engine_arguments(parser)
    add_telemetry_arguments(parser)
    parser.set_defaults(run=run)


@dataclass(frozen=True, slots=True)
class Configuration:
    """One engine set-up the bench times: its label, policy, telemetry level, tensor-parallel size,
    the JSON schema every request follows (None: free text) and the LoRA adapters requests take
    turns over (0: the base model)."""

    label: str
    policy: str
    level: str
    tensor_parallel_size: int
    schema: dict | None = None
    num_loras: int = 0


# Many records of several typed fields: at least ~15 tokens each, so no output closes the JSON before
# W1's 128 tokens, and the grammar exercises objects, enums, bounded integers and strings.
_RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "name": {"type": "string", "maxLength": 16},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "name", "kind", "ok"],
    "additionalProperties": False,
}
BENCH_SCHEMA = {
    "type": "object",
    "properties": {"records": {"type": "array", "items": _RECORD, "minItems": 64}},
    "required": ["records"],
    "additionalProperties": False,
}


def run_engine(
    engine: LLMEngine,
    workload: list[BenchRequest],
    schema: dict | None = None,
    lora_names: tuple[str, ...] = (),
) -> RunResult:
    """Run every request of ``workload`` to completion on ``engine`` (greedy, ignore_eos), each constrained by
    ``schema`` when given, request ``i`` with adapter ``lora_names[i % len]`` when there are some.

    With a schema, one short request runs first, untimed: the backend's one-off vocabulary
    preprocessing (about 1.7 s per engine) is start-up, not throughput.
    """
    constraint = None if schema is None else StructuredOutput("json_schema", schema)
    if constraint is not None:
        engine.add_request(
            "bench-warmup",
            workload[0].prompt_token_ids,
            SamplingParams(temperature=0.0, max_tokens=2, structured_output=constraint),
        )
        while engine.has_unfinished_requests:
            engine.step()
    start = time.perf_counter()
    for index, request in enumerate(workload):
        params = SamplingParams(
            temperature=0.0,
            max_tokens=request.output_len,
            ignore_eos=True,
            structured_output=constraint,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        lora_name = lora_names[index % len(lora_names)] if lora_names else None
        engine.add_request(f"bench-{index}", request.prompt_token_ids, params, lora_name=lora_name)
    num_output = 0
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                num_output += len(output.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    return RunResult(seconds, sum(len(r.prompt_token_ids) for r in workload), num_output)


def _median(results: list[RunResult]) -> RunResult:
    return sorted(results, key=lambda r: r.seconds)[len(results) // 2]


def _configurations(args) -> list[Configuration]:
    """Every configuration to time; the first is the baseline."""
    policies = [args.scheduling_policy] + [p for p in args.compare_policies.split(",") if p]
    levels = [args.telemetry] + [t for t in args.compare_telemetry.split(",") if t]
    sizes = [args.tensor_parallel_size] + [
        int(n) for n in args.compare_tensor_parallel.split(",") if n
    ]
    configurations = []
    for policy in policies:
        for level in levels:
            label = (
                policy
                if len(levels) == 1
                else (f"telemetry-{level}" if len(policies) == 1 else f"{policy}/{level}")
            )
            for size in sizes:
                configurations.append(
                    Configuration(
                        label if len(sizes) == 1 else f"{label}/tp{size}", policy, level, size
                    )
                )
    first = configurations[0]
    if args.compare_schema:
        configurations.append(dataclasses.replace(first, label="json-schema", schema=BENCH_SCHEMA))
    for count in (int(n) for n in args.compare_lora.split(",") if n):
        configurations.append(dataclasses.replace(first, label=f"lora-x{count}", num_loras=count))
    return configurations


def _rotated(configurations: list, repeat: int) -> list:
    """The configurations in the order of one repeat: each repeat starts one further along.

    Later runs within a repeat measured up to 8% slower on the development machine whatever they
    ran, so no configuration may always go first.
    """
    shift = repeat % len(configurations)
    return configurations[shift:] + configurations[:shift]


def _fresh_engine(args, configuration: Configuration) -> LLMEngine:
    """An engine whose telemetry plugins follow the configuration's level (full tracing exports
    into an encoding sink), with LoRA on when the configuration uses adapters."""
    level = configuration.level
    telemetry = dataclasses.replace(
        settings_from_args(args), metrics=level != "off", tracing=level == "full"
    )
    tracing.set_tracer_provider(sink_tracer_provider()[0] if level == "full" else None)
    return LLMEngine(
        engine_config_from_args(
            args,
            scheduling_policy=configuration.policy,
            telemetry=telemetry,
            tensor_parallel_size=configuration.tensor_parallel_size,
            enable_lora=bool(configuration.num_loras) or args.enable_lora,
        )
    )


def _timed_run(
    args, configuration: Configuration, workload: list[BenchRequest], adapters: Path
) -> RunResult:
    """One run on a fresh engine, shut down afterwards (which stops tensor-parallel workers); the
    configuration's random adapters are written under ``adapters`` once and loaded before the clock
    starts."""
    engine = _fresh_engine(args, configuration)
    try:
        names = tuple(f"bench-lora-{i}" for i in range(configuration.num_loras))
        for seed, name in enumerate(names):
            path = adapters / name
            if not path.exists():
                write_random_lora(path, engine.arch, args.max_lora_rank, seed)
            engine.add_lora(name, str(path))
        return run_engine(engine, workload, configuration.schema, names)
    finally:
        engine.shutdown()


def run(args) -> int:
    """Run every configuration on each workload, interleaved over the repeats; print medians and ratios.

    Each run gets a fresh engine with its own telemetry settings, so load time is outside the
    timed region and every configuration starts from an empty cache; the order rotates from one
    repeat to the next.
    """
    try:
        with tempfile.TemporaryDirectory(prefix="spyglass-bench-lora-") as adapters:
            _run_all(args, _configurations(args), Path(adapters))
    finally:
        tracing.set_tracer_provider(None)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


def _run_all(args, configurations: list[Configuration], adapters: Path) -> None:
    probe = _fresh_engine(args, configurations[0])
    print(
        f"model {probe.model_name} dtype {probe.info.dtype} device {probe.info.device} "
        f"kv blocks {probe.info.num_kv_blocks} ({probe.info.kv_cache_dtype}) threads {torch.get_num_threads()}"
    )
    vocab, probe_device = probe.arch.vocab_size, probe.device.type
    probe.shutdown()
    del probe
    hf = (
        HFStaticBatching(args.model, engine_config_from_args(args).torch_dtype(), probe_device)
        if args.compare_hf
        else None
    )
    for name in [w for w in args.workloads.split(",") if w]:
        workload = (
            WORKLOADS[name](vocab)
            if args.num_requests is None
            else WORKLOADS[name](vocab, args.num_requests)
        )
        runs: dict[str, list[RunResult]] = {c.label: [] for c in configurations}
        if hf and name == "w1":
            runs["hf-static"] = []
        for repeat in range(args.repeats):
            for configuration in _rotated(configurations, repeat):
                gc.collect()  # the previous run's engine and its KV cache go before this one starts
                runs[configuration.label].append(
                    _timed_run(args, configuration, workload, adapters)
                )
            if "hf-static" in runs:
                runs["hf-static"].append(hf.run(workload))
        _report(
            name,
            workload,
            {label: _median(r) for label, r in runs.items()},
            configurations[0].label,
        )


def _report(
    name: str, workload: list[BenchRequest], medians: dict[str, RunResult], baseline: str
) -> None:
    print(
        f"\n{name}: {len(workload)} requests, {sum(len(r.prompt_token_ids) for r in workload)} prompt tokens, "
        f"{sum(r.output_len for r in workload)} output tokens (median of runs)"
    )
    print(f"{'config':<22}{'seconds':>9}{'out tok/s':>11}{'total tok/s':>13}  vs {baseline}")
    reference = medians[baseline].output_tokens_per_s
    for label, result in medians.items():
        ratio = result.output_tokens_per_s / reference
        print(
            f"{label:<22}{result.seconds:>9.2f}{result.output_tokens_per_s:>11.1f}"
            f"{result.total_tokens_per_s:>13.1f}  {ratio:.2f}x"
        )
    if "json-schema" in medians:
        schema, plain = medians["json-schema"], medians[baseline]
        cost = schema.seconds / plain.seconds - 1
        print(
            f"json-schema / {baseline} time: {1 + cost:.3f}x ({cost:+.1%} for the schema; "
            f"{schema.num_output_tokens} vs {plain.num_output_tokens} tokens generated)"
        )
    if "hf-static" in medians:
        gain = reference / medians["hf-static"].output_tokens_per_s
        print(f"spyglass / hf-static output throughput: {gain:.2f}x")
