"""``spyglass bench policies``: one mixed workload under each scheduling policy, TTFT and throughput per class.

Interactive requests (short prompt, short answer) and batch requests (long prompt, long answer)
arrive together, the batch ones first in the queue, which is the worst case for FCFS. Each
request carries what every policy reads: ``priority`` (interactive 0, batch 1), a tenant (its
class) and a TTFT target (``ttft_slo_s``: interactive tight, batch loose). Engines run one after
the other, so each policy has the machine to itself.
"""

import time
from dataclasses import dataclass

import numpy as np

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import SamplingParams

POLICIES = "fcfs,static,priority,fair,slo"


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One class of the mixed workload."""

    name: str
    count: int
    prompt_len: int
    output_len: int
    priority: int
    ttft_slo_s: float


def add_parser(subparsers, argv) -> None:
    """Register ``bench policies``."""
    parser = subparsers.add_parser(
        "policies", help="mixed interactive + batch workload under each scheduling policy"
    )
    parser.add_argument(
        "--policies", default=POLICIES, help=f"comma-separated (default {POLICIES})"
    )
    parser.add_argument("--num-interactive", type=int, default=32)
    parser.add_argument("--interactive-prompt-len", type=int, default=32)
    parser.add_argument("--interactive-output-len", type=int, default=16)
    parser.add_argument("--interactive-ttft-slo", type=float, default=0.5, help="seconds")
    parser.add_argument("--num-batch", type=int, default=16)
    parser.add_argument("--batch-prompt-len", type=int, default=512)
    parser.add_argument("--batch-output-len", type=int, default=128)
    parser.add_argument("--batch-ttft-slo", type=float, default=60.0, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)
    parser.set_defaults(run=run)


def workload(args, vocab_size: int) -> list[tuple[RequestClass, list[int]]]:
    """Batch requests first, then interactive ones, all queued at once."""
    classes = [
        RequestClass("batch", args.num_batch, args.batch_prompt_len, args.batch_output_len, 1, args.batch_ttft_slo),
        RequestClass("interactive", args.num_interactive, args.interactive_prompt_len, args.interactive_output_len, 0,
                     args.interactive_ttft_slo),
    ]  # fmt: skip
    rng = np.random.default_rng(args.seed)
    return [
        (c, rng.integers(100, vocab_size, size=c.prompt_len).tolist())
        for c in classes
        for _ in range(c.count)
    ]


def run_policy(
    engine: LLMEngine, requests: list[tuple[RequestClass, list[int]]]
) -> tuple[float, list[Request]]:
    """Queue every request, step to the end; (start time, the finished requests)."""
    start = time.monotonic()
    live = []
    for index, (cls, prompt) in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=cls.output_len, ignore_eos=True, priority=cls.priority,
                                extra={"ttft_slo_s": cls.ttft_slo_s})  # fmt: skip
        live.append(
            engine.add_request(
                f"{cls.name}-{index}", prompt, params, attributes={"tenant": cls.name}
            )
        )
    while engine.has_unfinished_requests:
        engine.step()
    return start, live


def warm_up(engine: LLMEngine) -> None:
    """One short request first, so one-off start-up costs (allocations, kernel selection) are not measured."""
    engine.add_request(
        "warm-up",
        list(range(100, 164)),
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
    )
    while engine.has_unfinished_requests:
        engine.step()


def run(args) -> int:
    """Run the workload under each policy and print one row per policy and class."""
    policies = [p for p in args.policies.split(",") if p]
    print(f"{'policy':<10}{'class':<13}{'n':>4}{'TTFT P50 s':>12}{'TTFT P99 s':>12}{'SLO met':>9}"
          f"{'out tok/s':>11}{'done at s':>11}")  # fmt: skip
    for policy in policies:
        engine = LLMEngine(engine_config_from_args(args, scheduling_policy=policy))
        warm_up(engine)
        requests = workload(args, engine.arch.vocab_size)
        start, finished = run_policy(engine, requests)
        engine.shutdown()
        for cls in dict.fromkeys(c for c, _ in requests):
            mine = [r for r in finished if r.req_id.startswith(cls.name + "-")]
            ttft = np.array([r.times.first_token - r.times.arrival for r in mine])
            done = max(r.times.finished for r in mine) - start
            output = sum(r.num_output_tokens for r in mine)
            met = float(np.mean(ttft <= cls.ttft_slo_s))
            print(f"{policy:<10}{cls.name:<13}{len(mine):>4}{np.percentile(ttft, 50):>12.3f}"
                  f"{np.percentile(ttft, 99):>12.3f}{met:>9.0%}{output / done:>11.1f}{done:>11.2f}")  # fmt: skip
    return 0
