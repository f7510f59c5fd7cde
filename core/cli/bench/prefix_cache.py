"""``spyglass bench prefix-cache``: a long shared system prompt and many questions, with and without the cache.

The same engine configuration runs twice in one process: with the ``prefix_cache`` plugin and
with it disabled. The first question runs alone (it fills the cache); the rest run with
``--concurrency`` requests in flight. TTFT is reported for those later, potentially cached
requests; throughput for the whole run.
"""

import time

import numpy as np

from spyglass.core.cli.bench.policies import warm_up
from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import SamplingParams


def add_parser(subparsers, argv) -> None:
    """Register ``bench prefix-cache``."""
    parser = subparsers.add_parser(
        "prefix-cache", help="shared system prompt: TTFT with and without the prefix cache"
    )
    parser.add_argument("--system-len", type=int, default=1024, help="shared system prompt tokens")
    parser.add_argument("--num-questions", type=int, default=64)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="requests in flight after the first"
    )
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)
    parser.set_defaults(run=run)


def prompts(args, vocab_size: int) -> list[list[int]]:
    """The shared system prompt followed by a different question each."""
    rng = np.random.default_rng(args.seed)
    system = rng.integers(100, vocab_size, size=args.system_len).tolist()
    return [
        system + rng.integers(100, vocab_size, size=args.question_len).tolist()
        for _ in range(args.num_questions)
    ]


def run_closed_loop(
    engine: LLMEngine, prompts: list[list[int]], output_len: int, concurrency: int
) -> list[Request]:
    """The first prompt alone, then the rest with ``concurrency`` in flight; the finished requests in order."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    queue = list(enumerate(prompts))
    done: list[Request] = []

    def submit() -> Request:
        index, prompt = queue.pop(0)
        return engine.add_request(f"q-{index}", prompt, params)

    live = [submit()]
    while live:
        engine.step()
        for request in [r for r in live if r.is_finished]:
            live.remove(request)
            done.append(request)
        limit = 1 if not done else concurrency
        while queue and len(live) < limit:
            live.append(submit())
    return sorted(done, key=lambda r: int(r.req_id.split("-")[1]))


def run(args) -> int:
    """Both configurations, then one table."""
    rows = []
    for label, cached in (("no cache", False), ("prefix cache", True)):
        config = engine_config_from_args(args)
        if not cached:
            config.disabled_plugins = [*config.disabled_plugins, "prefix_cache"]
        elif config.plugins is not None and "prefix_cache" not in config.plugins:
            config.plugins = [*config.plugins, "prefix_cache"]
        engine = LLMEngine(config)
        warm_up(engine)  # a prompt unrelated to the system prompt: the cache starts cold
        start = time.perf_counter()
        finished = run_closed_loop(
            engine, prompts(args, engine.arch.vocab_size), args.output_len, args.concurrency
        )
        seconds = time.perf_counter() - start
        engine.shutdown()
        later = finished[1:]
        ttft = np.array([r.times.first_token - r.times.arrival for r in later])
        hit = sum(r.num_cached_tokens for r in later) / max(
            1, sum(r.num_prompt_tokens for r in later)
        )
        output = sum(r.num_output_tokens for r in finished)
        rate = len(finished) / seconds
        rows.append((label, np.median(ttft), np.percentile(ttft, 99), rate, output / seconds, hit))
    print(f"{args.num_questions} questions of {args.question_len} tokens after a {args.system_len}-token system "
          f"prompt, {args.output_len} output tokens, concurrency {args.concurrency}")  # fmt: skip
    print(
        f"{'config':<14}{'TTFT P50 s':>12}{'TTFT P99 s':>12}{'req/s':>8}{'out tok/s':>11}{'cached':>8}"
    )
    for label, p50, p99, rps, tps, hit in rows:
        print(f"{label:<14}{p50:>12.3f}{p99:>12.3f}{rps:>8.2f}{tps:>11.1f}{hit:>8.0%}")
    print(f"median TTFT speed-up with the cache: {rows[0][1] / rows[1][1]:.1f}x")
    return 0
