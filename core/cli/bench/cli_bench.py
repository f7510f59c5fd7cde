"""``spyglass bench <name>``: one subcommand per benchmark module, imported only when it runs."""

from collections.abc import Sequence

from spyglass.core.cli.main import add_log_requests_argument, add_subcommands

BENCHMARKS = {
    "throughput": ("spyglass.core.cli.bench.throughput", "offline throughput on W1 / W3"),
    "serve": (
        "spyglass.core.cli.bench.serve",
        "online serving latency and throughput against a running server",
    ),
    "soak": (
        "spyglass.core.cli.bench.soak",
        "many requests with random client disconnects against a running server",
    ),
    "latency": (
        "spyglass.core.cli.bench.latency",
        "batch-1 decode latency, with and without speculation",
    ),
    "steps": (
        "spyglass.core.cli.bench.step_phases",
        "where a decode step's time goes (schedule, prepare, launch, wait, update) per batch",
    ),
    "startup": (
        "spyglass.core.cli.bench.start_time",
        "seconds from starting spyglass serve until /ready answers",
    ),
    "policies": (
        "spyglass.core.cli.bench.policies",
        "mixed interactive + batch workload under each scheduling policy",
    ),
    "prefix-cache": (
        "spyglass.core.cli.bench.prefix_cache",
        "shared system prompt: TTFT with and without the prefix cache",
    ),
    "embed": (
        "spyglass.core.cli.bench.embed",
        "embedding throughput and agreement against HF transformers",
    ),
    "vision": (
        "spyglass.core.cli.bench.vision",
        "prompts with images: throughput against HF transformers' LLaVA",
    ),
}


def add_parser(subparsers, argv: Sequence[str]) -> None:
    """Register ``bench`` and its benchmarks."""
    parser = subparsers.add_parser("bench", help="run a benchmark")
    add_log_requests_argument(parser, "they would drown the tables")
    add_subcommands(parser.add_subparsers(dest="benchmark", required=True), BENCHMARKS, argv)
