"""``spyglass bench serve``: the W3 workload against a running server, measured like vLLM's serving benchmark.

Every request goes to ``/v1/completions`` with a token-list prompt, ``stream=true`` and
``ignore_eos``, so the server generates exactly the workload's output length. Arrivals follow
a Poisson process at ``--rate`` requests/s, or ``--concurrency`` clients send back to back.
``--no-stream`` sends non-streamed calls: throughput and end-to-end latency only.
"""

import asyncio
import json
import logging
import math
import os
import sys
from dataclasses import asdict

import numpy as np

from spyglass.core.cli.bench.serve_clients import run_in_processes
from spyglass.core.cli.bench.serve_load import RequestResult, run_load
from spyglass.core.cli.bench.workloads import w3_workload


def add_parser(subparsers, argv) -> None:
    """Register ``bench serve``."""
    parser = subparsers.add_parser(
        "serve", help="online serving latency and throughput against a running server"
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--rate",
        type=float,
        default=math.inf,
        help="Poisson arrivals per second (default: all at once)",
    )
    load.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="clients sending back to back, instead of --rate",
    )
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=3, help="W3 workload seed")
    parser.add_argument(
        "--vocab-size", type=int, default=49152, help="token ids are drawn below this (model vocab)"
    )
    parser.add_argument("--model", default=None, help="model name to send (default: omitted)")
    parser.add_argument("--api-key", default=os.environ.get("SPYGLASS_API_KEY"))
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="send from this many client processes, so that parsing the streams does not "
        "bound what is measured (bench/serve_clients.py)",
    )
    parser.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="send non-streamed calls (throughput and end-to-end latency; no TTFT, TPOT or ITL)",
    )
    parser.add_argument(
        "--json", dest="json_path", default=None, help="also write the results to this JSON file"
    )
    parser.set_defaults(run=run)


def _percentiles(values: list[float]) -> dict[str, float]:
    """Mean, median, P90 and P99 in milliseconds (zeros when there are no values)."""
    data = np.array(values or [0.0]) * 1000
    return {
        "mean": float(data.mean()),
        "median": float(np.median(data)),
        "p90": float(np.percentile(data, 90)),
        "p99": float(np.percentile(data, 99)),
    }


def summarize(results: list[RequestResult], duration: float, streamed: bool = True) -> dict:
    """The benchmark's numbers: counts, throughputs, and TTFT/TPOT/ITL/E2E percentiles (ms);
    without ``streamed`` the first three are None (a whole answer comes at once)."""
    done = [r for r in results if r.ok]
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.output_len for r in done)
    tpots = [(r.e2e - r.ttft) / (r.output_len - 1) for r in done if r.output_len > 1]
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "ttft_ms": _percentiles([r.ttft for r in done]) if streamed else None,
        "tpot_ms": _percentiles(tpots) if streamed else None,
        "itl_ms": _percentiles([itl for r in done for itl in r.itls]) if streamed else None,
        "e2e_ms": _percentiles([r.e2e for r in done]),
    }


def _print(summary: dict, load: str) -> None:
    line = "{:<40}{:<10}"
    print("{:=^50}".format(" Serving Benchmark Result "))
    print(line.format("Load:", load))
    for label, key, fmt in [
        ("Successful requests:", "completed", "{}"),
        ("Failed requests:", "failed", "{}"),
        ("Benchmark duration (s):", "duration_s", "{:.2f}"),
        ("Total input tokens:", "total_input_tokens", "{}"),
        ("Total generated tokens:", "total_output_tokens", "{}"),
        ("Request throughput (req/s):", "request_throughput", "{:.2f}"),
        ("Output token throughput (tok/s):", "output_throughput", "{:.2f}"),
        ("Total token throughput (tok/s):", "total_token_throughput", "{:.2f}"),
    ]:
        print(line.format(label, fmt.format(summary[key])))
    for title, key, name in [
        ("Time to First Token", "ttft_ms", "TTFT"),
        ("Time per Output Token (excl. 1st token)", "tpot_ms", "TPOT"),
        ("Inter-token Latency", "itl_ms", "ITL"),
        ("End-to-end Latency", "e2e_ms", "E2E"),
    ]:
        stats = summary[key]
        if stats is None:  # not streamed
            continue
        print(f"{title:-^50}")
        for stat, label in [("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")]:
            print(line.format(f"{label} {name} (ms):", f"{stats[stat]:.2f}"))
    print("=" * 50)
    for error in summary["errors"]:
        print(f"error: {error}")


def run(args) -> int:
    """Send the workload, print the summary, optionally write it as JSON; exit 1 if any request failed."""
    # One INFO line per HTTP request would bury the report.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.client_processes < 1:
        print("spyglass bench serve: --client-processes must be at least 1", file=sys.stderr)
        return 2
    if args.concurrency and args.client_processes > args.concurrency:
        # A process with no client of its own would send its share all at once instead.
        print(
            "spyglass bench serve: --client-processes must not exceed --concurrency",
            file=sys.stderr,
        )
        return 2
    workload = w3_workload(args.vocab_size, args.num_prompts, args.seed)
    if args.client_processes > 1:
        results, start, end = run_in_processes(args, workload, args.client_processes)
    else:
        results, start, end = asyncio.run(run_load(args, workload))
    summary = summarize(results, end - start, args.stream)
    load = f"concurrency {args.concurrency}" if args.concurrency else f"rate {args.rate} req/s"
    if not args.stream:
        load += ", not streamed"
    if args.client_processes > 1:
        load += f", {args.client_processes} client processes"
    _print(summary, load)
    if args.json_path:
        record = {
            "base_url": args.base_url,
            "load": load,
            "num_prompts": args.num_prompts,
            **summary,
            "per_request": [asdict(r) for r in results],
        }
        with open(args.json_path, "w") as out:
            json.dump(record, out, indent=2)
    return 0 if summary["failed"] == 0 else 1
