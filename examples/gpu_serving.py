"""W3 served over HTTP against the same requests offline, for `gpu_check` (issue 19's 80% target)."""

import gc
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import psutil
import torch

from spyglass.core.cli.bench.throughput import run_engine
from spyglass.core.cli.bench.workloads import w3_workload
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.telemetry.settings import TelemetrySettings

# Each row: the server's flags, and how many processes the bench's client sends from (one Python
# client parsing 256 streams took 1.5 cores on the H200: the row with one shows what that costs).
# The last streams every fourth token (`--stream-interval`): a quarter of the outputs to build,
# send, parse and write.
SERVE_MODES = {
    "engine thread": (["--no-engine-process"], 4),
    "engine process": (["--engine-process"], 4),
    "engine process, one client process": (["--engine-process"], 1),
    "engine process, stream interval 4": (["--engine-process", "--stream-interval", "4"], 4),
}


def serve_and_bench(
    model: str,
    device: str,
    num_prompts: int,
    flags: list[str],
    port: int,
    profile: Path | None = None,
    client_processes: int = 1,
    seeds: tuple[int, ...] = (3,),
) -> dict:
    """Start ``spyglass serve`` on ``model`` (bf16, telemetry off), send ``num_prompts`` W3 requests
    at once with ``spyglass bench serve`` (from ``client_processes`` processes) once per W3 seed in
    ``seeds``, one load after the other, stop the server. The bench's JSON summaries, in seed order,
    under ``"runs"``; the CPU time the server's process, its engine process (if any) and the
    bench's clients (with their start) took per second of the loads under ``"cpu_share"`` (1.0: a
    core kept busy), which says which of them sets the pace. With ``profile`` (a path prefix) and
    py-spy installed, each server process is sampled through the loads into ``<profile>-<n>.txt``
    (collapsed stacks), summarised under ``"profiles"``."""
    spyglass = [sys.executable, "-m", "spyglass.core.cli.main"]
    server = subprocess.Popen(
        [
            *spyglass,
            "serve",
            model,
            "--dtype",
            "bfloat16",
            "--device",
            device,
            "--port",
            str(port),
            "--max-num-seqs",
            "256",
            "--telemetry",
            "off",
            "--disable-access-log",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not _healthy(base_url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"spyglass serve {' '.join(flags)} did not start")
            time.sleep(0.5)
        front = psutil.Process(server.pid)
        # The engine process is spawned by multiprocessing (its resource tracker is not counted).
        engines = [c for c in front.children() if "spawn_main" in " ".join(c.cmdline())]
        processes = [front, *engines]
        before = [_cpu_seconds(process) for process in processes]
        client_before = _children_cpu_seconds()
        samplers = _start_sampling(processes, profile)
        runs = []
        for seed in seeds:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                subprocess.run(
                    [
                        *spyglass,
                        "bench",
                        "serve",
                        "--base-url",
                        base_url,
                        "--num-prompts",
                        str(num_prompts),
                        "--seed",
                        str(seed),
                        "--client-processes",
                        str(client_processes),
                        "--json",
                        out.name,
                    ],
                    check=False,
                    stdout=subprocess.DEVNULL,
                )
                runs.append(json.loads(Path(out.name).read_text()))
        load = sum(run["duration_s"] for run in runs)
        cpu_share = [
            (_cpu_seconds(process) - spent) / load for process, spent in zip(processes, before)
        ] + [(_children_cpu_seconds() - client_before) / load]
        return {"runs": runs, "cpu_share": cpu_share, "profiles": _stop_sampling(samplers)}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _children_cpu_seconds() -> float:
    """CPU seconds of this process's finished children (the bench's client, once it has run)."""
    times = os.times()
    return times.children_user + times.children_system


def _start_sampling(
    processes: list[psutil.Process], profile: Path | None
) -> list[tuple[subprocess.Popen, Path]]:
    """A py-spy sampler per process (none without ``profile`` or py-spy)."""
    if profile is None or shutil.which("py-spy") is None:
        return []
    samplers = []
    for index, process in enumerate(processes):
        path = Path(f"{profile}-{index}.txt")
        command = ["py-spy", "record", "--pid", str(process.pid), "--format", "raw"]
        command += ["--output", str(path), "--rate", "200", "--nonblocking"]
        samplers.append((subprocess.Popen(command, stdout=subprocess.DEVNULL), path))
    return samplers


def _stop_sampling(samplers: list[tuple[subprocess.Popen, Path]]) -> list[list[str]]:
    """Stop each sampler (SIGINT writes its file) and summarise what it saw."""
    summaries = []
    for sampler, path in samplers:
        sampler.send_signal(signal.SIGINT)
        sampler.wait(60)
        summaries.append(hottest_frames(path) if path.exists() else [f"no samples in {path}"])
    return summaries


def hottest_frames(path: Path, count: int = 15) -> list[str]:
    """The functions of a collapsed-stacks file that held the most samples, on the stack
    (inclusive) and at its top (self), as table rows."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        total += int(samples)
        own[frames[-1]] += int(samples)
        for frame in set(frames):
            inclusive[frame] += int(samples)
    rows = ["| on stack | at top | function |", "|---|---|---|"]
    for frame, samples in inclusive.most_common(count):
        rows.append(f"| {samples / total:.0%} | {own[frame] / total:.0%} | {frame} |")
    rows += ["", "| at top | function |", "|---|---|"]
    rows += [f"| {n / total:.0%} | {frame} |" for frame, n in own.most_common(count)]
    return rows


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serving_table(
    model: str,
    device: str,
    num_prompts: int,
    profile_dir: Path | None = None,
    seeds: tuple[int, ...] = (3, 4, 5),
) -> list[str]:
    """W3 through HTTP (all requests at once) with the engine in the server's thread and in its own
    process, against the same requests offline on the same settings (issue 19's 80% target), once
    per W3 seed in ``seeds``: each row's share of offline is the median of its per-seed shares
    (each load against offline's of the same seed), its latencies those of its median load. With
    ``profile_dir``, each server process's hottest functions follow the table (`serve_and_bench`)."""
    quiet = TelemetrySettings(metrics=False, tracing=False)  # as the servers' --telemetry off
    engine = LLMEngine(
        EngineConfig(
            model=model, dtype="bfloat16", device=device, max_num_seqs=256, telemetry=quiet
        )
    )
    vocab = engine.arch.vocab_size
    offline = [
        run_engine(engine, w3_workload(vocab, num_prompts, seed)).output_tokens_per_s
        for seed in seeds
    ]
    engine.shutdown()
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    rows = [
        f"offline W3 ({num_prompts} requests, seeds {', '.join(map(str, seeds))}): "
        f"{' / '.join(f'{rate:,.0f}' for rate in offline)} output tok/s",
        "",
        "| engine | served output tok/s, per seed | of offline: median (per seed) | failed "
        "| median TTFT ms | P99 TTFT ms | median TPOT ms | P99 ITL ms "
        "| CPU: server, engine process, client |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    profiles = []
    for index, (mode, (flags, clients)) in enumerate(SERVE_MODES.items()):
        profile = None if profile_dir is None else profile_dir / re.sub(r"\W+", "-", mode)
        got = serve_and_bench(
            model, device, num_prompts, flags, 8790 + index, profile, clients, seeds
        )
        for process, summary in zip(("server", "engine process"), got["profiles"]):
            profiles += ["", f"{mode}, {process}:", "", *summary]
        runs = got["runs"]
        shares = [run["output_throughput"] / rate for run, rate in zip(runs, offline)]
        middle = runs[shares.index(statistics.median_low(shares))]
        served = " / ".join(f"{run['output_throughput']:,.0f}" for run in runs)
        rows.append(
            f"| {mode} | {served} "
            f"| {statistics.median(shares):.0%} ({' / '.join(f'{s:.0%}' for s in shares)}) "
            f"| {sum(run['failed'] for run in runs)} "
            f"| {middle['ttft_ms']['median']:.0f} | {middle['ttft_ms']['p99']:.0f} "
            f"| {middle['tpot_ms']['median']:.1f} | {middle['itl_ms']['p99']:.0f} "
            f"| {', '.join(f'{share:.0%}' for share in got['cpu_share'])} |"
        )
    return rows + profiles
