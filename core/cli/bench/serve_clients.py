"""``bench serve --client-processes N``: the load sent from N client processes at once.

One Python client parsing every streamed event of a few hundred requests can be slower than the
server it measures (on the H200, one client took 1.5 cores while the server took a third of one),
so that the benchmark would measure itself. Request ``i`` goes to process ``i % N``; each sends
its share as the one process would (Poisson arrivals at ``--rate / N``, or its share of the
``--concurrency`` clients), after all of them are ready, and the run lasts from the first
process's start to the last one's end (the monotonic clock is the machine's, not a process's).
"""

import argparse
import asyncio
import logging
import math
import multiprocessing
import queue

from spyglass.core.cli.bench.serve_load import RequestResult, run_load
from spyglass.core.cli.bench.workloads import BenchRequest


def share_args(args: argparse.Namespace, index: int, processes: int) -> argparse.Namespace:
    """``args`` for client process ``index`` of ``processes``: its part of the rate or of the
    concurrency, and a seed of its own for its arrivals."""
    share = argparse.Namespace(**vars(args))
    share.seed = args.seed + index
    if args.concurrency:
        share.concurrency = args.concurrency // processes + (index < args.concurrency % processes)
    elif math.isfinite(args.rate):
        share.rate = args.rate / processes
    return share


def _client(args, workload, ready, results: multiprocessing.Queue) -> None:
    """One client process: wait for the others, send ``workload``, put what it measured."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    ready.wait()
    results.put(asyncio.run(run_load(args, workload)))


def run_in_processes(
    args: argparse.Namespace, workload: list[BenchRequest], processes: int
) -> tuple[list[RequestResult], float, float]:
    """The workload sent from ``processes`` client processes: every result, the first start and
    the last end (monotonic seconds)."""
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(processes)
    results = context.Queue()
    clients = [
        context.Process(
            target=_client,
            args=(share_args(args, index, processes), workload[index::processes], ready, results),
            daemon=True,
        )
        for index in range(processes)
    ]
    for client in clients:
        client.start()
    collected = []
    while len(collected) < processes:
        try:
            collected.append(results.get(timeout=1.0))
        except queue.Empty:
            if any(client.exitcode not in (None, 0) for client in clients):
                raise RuntimeError("a client process failed") from None
    for client in clients:
        client.join()
    return (
        [result for part, _, _ in collected for result in part],
        min(start for _, start, _ in collected),
        max(end for _, _, end in collected),
    )
