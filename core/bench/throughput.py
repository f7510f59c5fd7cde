"""``spyglass bench throughput``: offline throughput on W1 and W3, optionally against HF static batching.

Every configuration runs ``--repeats`` times, interleaved, and the median is reported, so a
machine-wide slowdown hits all configurations alike and the printed ratios stay meaningful.
"""

import resource
import time
import torch

from spyglass.core.bench.hf_static import HFStaticBatching
from spyglass.core.bench.results import RunResult
from spyglass.core.bench.workloads import WORKLOADS, BenchRequest
from spyglass.core.engine import LLMEngine
from spyglass.core.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.sampling_params import SamplingParams


def add_parser(subparsers) -> None:
    """Register ``bench throughput``."""
    parser = subparsers.add_parser("throughput", help="offline throughput on W1 / W3")
    parser.add_argument("--workloads", default="w1,w3", help="comma-separated: w1, w3")
    parser.add_argument("--num-requests", type=int, default=None, help="override the workload's request count")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-hf", action="store_true", help="also time HF transformers static batching on W1")
    parser.add_argument(
        "--compare-policies", default="", help="comma-separated scheduling policies to run beside --policy"
    )
    add_engine_arguments(parser)
    parser.set_defaults(run=run)


def run_engine(engine: LLMEngine, workload: list[BenchRequest]) -> RunResult:
    """Run every request of ``workload`` to completion on ``engine`` (greedy, ignore_eos)."""
    start = time.perf_counter()
    for index, request in enumerate(workload):
        params = SamplingParams(temperature=0.0, max_tokens=request.output_len, ignore_eos=True)
        engine.add_request(f"bench-{index}", request.prompt_token_ids, params)
    num_output = 0
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                num_output += len(output.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    return RunResult(seconds, sum(len(r.prompt_token_ids) for r in workload), num_output)


def _median(results: list[RunResult]) -> RunResult:
    return sorted(results, key=lambda r: r.seconds)[len(results) // 2]


def run(args) -> int:
    """Build one engine per configuration, run the workloads interleaved, print medians and ratios."""
    policies = [args.scheduling_policy] + [p for p in args.compare_policies.split(",") if p]
    engines = {policy: LLMEngine(engine_config_from_args(args, scheduling_policy=policy)) for policy in policies}
    first = engines[policies[0]]
    vocab = first.arch.vocab_size
    print(f"model {first.model_name} dtype {first.info.dtype} device {first.info.device} "
          f"kv blocks {first.info.num_kv_blocks} threads {torch.get_num_threads()}")
    hf = HFStaticBatching(args.model, first.info.dtype) if args.compare_hf else None
    for name in [w for w in args.workloads.split(",") if w]:
        workload = WORKLOADS[name](vocab) if args.num_requests is None else WORKLOADS[name](vocab, args.num_requests)
        runs: dict[str, list[RunResult]] = {label: [] for label in policies}
        if hf and name == "w1":
            runs["hf-static"] = []
        for _ in range(args.repeats):
            for policy, engine in engines.items():
                runs[policy].append(run_engine(engine, workload))
            if "hf-static" in runs:
                runs["hf-static"].append(hf.run(workload))
        _report(name, workload, {label: _median(r) for label, r in runs.items()}, policies[0])
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


def _report(name: str, workload: list[BenchRequest], medians: dict[str, RunResult], baseline: str) -> None:
    print(f"\n{name}: {len(workload)} requests, {sum(len(r.prompt_token_ids) for r in workload)} prompt tokens, "
          f"{sum(r.output_len for r in workload)} output tokens (median of runs)")
    print(f"{'config':<14}{'seconds':>9}{'out tok/s':>11}{'total tok/s':>13}{'vs ' + baseline:>12}")
    reference = medians[baseline].output_tokens_per_s
    for label, result in medians.items():
        ratio = result.output_tokens_per_s / reference
        print(f"{label:<14}{result.seconds:>9.2f}{result.output_tokens_per_s:>11.1f}"
              f"{result.total_tokens_per_s:>13.1f}{ratio:>11.2f}x")
    if "hf-static" in medians:
        gain = reference / medians["hf-static"].output_tokens_per_s
        print(f"spyglass / hf-static output throughput: {gain:.2f}x")
