"""``spyglass bench <name>``: one subcommand per benchmark module."""

from spyglass.core.bench import latency, policies, prefix_cache, serve, soak, throughput

BENCHMARKS = (throughput, serve, soak, latency, policies, prefix_cache)


def add_parser(subparsers) -> None:
    """Register ``bench`` and its benchmarks."""
    parser = subparsers.add_parser("bench", help="run a benchmark")
    benchmarks = parser.add_subparsers(dest="benchmark", required=True)
    for benchmark in BENCHMARKS:
        benchmark.add_parser(benchmarks)
