"""One-shot GPU check: kernels and model parity on the device, attention bandwidth, CUDA-graph
timings, W1/W3 throughput at two model shapes against HF transformers on the same GPU, and W3
served over HTTP with the engine in a thread and in a process of its own, against offline.

    python examples/gpu_check.py [--quick] [--model PATH]

Runs offline from a copy of the checkout: without ``--model`` it builds the default model's shape
with random weights and the real tokenizer (`examples/gpu_model`, shipped configs), and always a
Llama-3.2-1B shape; ``SPYGLASS_DEFAULT_MODEL`` points every engine and the GPU tests at the first.
Prints its tables last (about 5 minutes on an H200). Without CUDA it says so and exits 1.
"""

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from spyglass.core.cli.bench import step_phases
from spyglass.core.cli.bench.hf_static import HFStaticBatching
from spyglass.core.cli.bench.throughput import run_engine
from spyglass.core.cli.bench.workloads import w1_workload, w3_workload
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.kernels import torch_attention, triton_attention
from spyglass.telemetry.settings import TelemetrySettings

# examples/gpu_model is a folder of files, not a package: its builder is imported by path.
sys.path.insert(0, str(Path(__file__).parent / "gpu_model"))
import random_model


def timed(function, repeats: int = 20) -> float:
    """Median seconds of ``function()`` on the GPU, after a warm-up."""
    function()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def timed_in_graph(function, calls: int = 20) -> float:
    """Median seconds of one ``function()`` replayed from a CUDA graph of ``calls`` calls: the GPU's
    time without the host's launch overhead, as a decode step inside a captured graph sees it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        function()  # compiles, and allocates outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            function()
    return timed(graph.replay, repeats=5) / calls


def copy_bandwidth() -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write), on 1 GiB."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    return 2 * source.numel() / timed(lambda: target.copy_(source))


def attention_table(bandwidth: float, quick: bool) -> list[str]:
    """Decode paged attention at bf16, 32 query / 8 KV heads of 128, block 16: time called eagerly and
    replayed in a CUDA graph (as decode runs while serving), and the graph's bandwidth fraction."""
    rows = [
        "| context | batch | eager ms | in graph ms | GB/s | of copy bw |",
        "|---|---|---|---|---|---|",
    ]
    heads, kv_heads, dim, block = 32, 8, 128, 16
    contexts = (512, 2048, 8192, 32768) if not quick else (512, 8192)
    for context in contexts:
        for batch in (1, 8, 64, 256):
            blocks_per_seq = context // block
            if batch * blocks_per_seq * block * kv_heads * dim * 2 * 2 > 40e9:
                continue
            num_blocks = batch * blocks_per_seq
            k_cache = torch.randn(
                num_blocks, block, kv_heads, dim, dtype=torch.bfloat16, device="cuda"
            )
            v_cache = torch.randn_like(k_cache)
            tables = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(
                batch, blocks_per_seq
            )
            lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
            starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
            query = torch.randn(batch, heads, dim, dtype=torch.bfloat16, device="cuda")

            def attend():
                return triton_attention.paged_attention(
                    query, k_cache, v_cache, tables, lens, starts, 1, context, dim**-0.5
                )

            eager, in_graph = timed(attend), timed_in_graph(attend)
            moved = 2 * k_cache.numel() * k_cache.element_size()
            rows.append(
                f"| {context} | {batch} | {eager * 1e3:.3f} | {in_graph * 1e3:.3f} | "
                f"{moved / in_graph / 1e9:.0f} | {moved / in_graph / bandwidth:.0%} |"
            )
    return rows


def check_kernels_against_torch() -> None:
    """Decode and mixed batches on the GPU: Triton vs the torch reference."""
    torch.manual_seed(0)
    k_cache = torch.randn(512, 16, 3, 64, device="cuda")
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(512, device="cuda", dtype=torch.int32).view(8, 64)
    lens = torch.tensor([1000, 17, 300, 1024, 5, 64, 700, 129], dtype=torch.int32, device="cuda")
    q_lens = [1, 17, 4, 1, 5, 1, 30, 2]
    starts = torch.tensor(
        [0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda"
    )
    query = torch.randn(sum(q_lens), 9, 64, device="cuda")
    args = (query, k_cache, v_cache, tables, lens, starts, max(q_lens), 1024, 0.125)
    error = (
        (triton_attention.paged_attention(*args) - torch_attention.paged_attention(*args))
        .abs()
        .max()
        .item()
    )
    print(f"triton vs torch paged attention, fp32 max abs error {error:.2e}")
    assert error < 1e-4


def engine_tokens(
    dtype: str, graphs: bool, device: str, prompts: list[str]
) -> tuple[LLMEngine, list[list[int]]]:
    """Greedy tokens of the default model for ``prompts``."""
    engine = LLMEngine(
        EngineConfig(dtype=dtype, device=device, cuda_graphs=graphs, max_num_seqs=256)
    )
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), engine.tokenizer.encode(prompt), params)
    results: dict[str, list[int]] = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                results[output.request_id] = output.outputs[0].token_ids
    return engine, [results[str(i)] for i in range(len(prompts))]


def decode_step_table(engines: dict[str, LLMEngine], quick: bool) -> list[str]:
    """Decode step time at each batch size, eager vs CUDA graphs, bf16 default model, context ~256."""
    rows = ["| batch | eager ms | graphs ms | speed-up |", "|---|---|---|---|"]
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256) if not quick else (1, 64):
        times = {}
        for label, engine in engines.items():
            params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
            for index in range(batch):
                engine.add_request(f"{label}-{batch}-{index}", list(range(100, 356)), params)
            for _ in range(3):  # prefill and the first decodes
                engine.step()
            samples = []
            while engine.has_unfinished_requests:
                torch.cuda.synchronize()
                start = time.perf_counter()
                engine.step()
                torch.cuda.synchronize()
                samples.append(time.perf_counter() - start)
            times[label] = statistics.median(samples[:-1])
        rows.append(
            f"| {batch} | {times['eager'] * 1e3:.2f} | {times['graphs'] * 1e3:.2f} | "
            f"{times['eager'] / times['graphs']:.2f}x |"
        )
    return rows


# How a step call orders the host's work around the device's (`LLMEngine.step`).
STEP_MODES = {
    "off": {"async_output": False},
    "output": {"async_output": True},
    "scheduling": {"async_output": True, "async_scheduling": True},
}


def step_phase_table(model: str, device: str, batches: tuple[int, ...]) -> list[str]:
    """Decode steps of ``model`` (bf16, CUDA graphs on ``device``) split into host phases and the
    wait for the device (`spyglass bench steps`): in turn, with async output, and with async
    scheduling too."""
    rows = [
        "| async | batch | step ms | schedule | prepare | launch | wait | update |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, options in STEP_MODES.items():
        config = EngineConfig(
            model=model, dtype="bfloat16", device=device, max_num_seqs=256, **options
        )
        engine = LLMEngine(config)
        for batch in batches:
            ms = {k: v * 1e3 for k, v in step_phases.phase_medians(engine, batch, 32, 64).items()}
            rows.append(
                f"| {mode} | {batch} | {ms['step']:.2f} | "
                + " | ".join(f"{ms[phase]:.2f}" for phase in step_phases.PHASES)
                + " |"
            )
        engine.shutdown()
    return rows


def throughput_rows(shape: str, model: str, device: str, num_requests: int | None) -> list[str]:
    """W1 and W3 output tokens/s on ``model`` (bf16, CUDA graphs on ``device``), with the default
    step mode and with async scheduling, and HF transformers' static batching on W1 on the same
    device; ``num_requests`` shrinks both workloads (None: full)."""
    ours = {}
    for mode in ("default", "async scheduling"):
        engine = LLMEngine(
            EngineConfig(
                model=model,
                dtype="bfloat16",
                device=device,
                max_num_seqs=256,
                **(STEP_MODES["scheduling"] if mode != "default" else {}),
            )
        )
        vocab = engine.arch.vocab_size
        sizes = {} if num_requests is None else {"num_requests": num_requests}
        w1, w3 = w1_workload(vocab, **sizes), w3_workload(vocab, **sizes)
        for name, work in (("W1", w1), ("W3", w3)):
            ours[name, mode] = run_engine(engine, work)
        engine.shutdown()
        del engine
        gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    hf = HFStaticBatching(model, torch.bfloat16, device).run(w1)
    cells = [
        f"{run.output_tokens_per_s:,.0f} ({run.seconds:.2f} s)" for run in (*ours.values(), hf)
    ]
    best = max(ours["W1", mode].output_tokens_per_s for mode in ("default", "async scheduling"))
    return [f"| {shape} | {' | '.join(cells)} | {best / hf.output_tokens_per_s:.2f}x |"]


def throughput_table(models: dict[str, str], device: str, num_requests: int | None) -> list[str]:
    """`throughput_rows` for every shape, under one header."""
    rows = [
        "| shape | W1 output tok/s | W3 output tok/s | W1, async scheduling | W3, async scheduling "
        "| HF static W1 | best W1 vs HF |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, model in models.items():
        rows += throughput_rows(shape, model, device, num_requests)
    return rows


SERVE_MODES = {"engine thread": [], "engine process": ["--engine-process"]}


def serve_and_bench(model: str, device: str, num_prompts: int, flags: list[str], port: int) -> dict:
    """Start ``spyglass serve`` on ``model`` (bf16, telemetry off), send ``num_prompts`` W3 requests
    at once with ``spyglass bench serve``, stop the server; the bench's JSON summary."""
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
                    "--json",
                    out.name,
                ],
                check=False,
                stdout=subprocess.DEVNULL,
            )
            return json.loads(Path(out.name).read_text())
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serving_table(model: str, device: str, num_prompts: int) -> list[str]:
    """W3 through HTTP (all requests at once) with the engine in the server's thread and in its own
    process, against the same requests offline on the same settings (issue 19's 80% target)."""
    quiet = TelemetrySettings(metrics=False, tracing=False)  # as the servers' --telemetry off
    engine = LLMEngine(
        EngineConfig(
            model=model, dtype="bfloat16", device=device, max_num_seqs=256, telemetry=quiet
        )
    )
    offline = run_engine(engine, w3_workload(engine.arch.vocab_size, num_prompts))
    engine.shutdown()
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    rows = [
        f"offline W3 ({num_prompts} requests): {offline.output_tokens_per_s:,.0f} output tok/s",
        "",
        "| engine | served output tok/s | of offline | failed | median TTFT ms | P99 TTFT ms "
        "| median TPOT ms | P99 ITL ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for index, (mode, flags) in enumerate(SERVE_MODES.items()):
        got = serve_and_bench(model, device, num_prompts, flags, 8790 + index)
        rows.append(
            f"| {mode} | {got['output_throughput']:,.0f} "
            f"| {got['output_throughput'] / offline.output_tokens_per_s:.0%} | {got['failed']} "
            f"| {got['ttft_ms']['median']:.0f} | {got['ttft_ms']['p99']:.0f} "
            f"| {got['tpot_ms']['median']:.1f} | {got['itl_ms']['p99']:.0f} |"
        )
    return rows


def build_models(model: str | None, directory: Path) -> dict[str, str]:
    """The default shape (``model`` when given, else random weights) and the 1B shape, built on the GPU."""
    default = model or str(random_model.build("default", directory / "default", device="cuda"))
    big = random_model.build("1b", directory / "1b", device="cuda")
    return {"default shape": default, "Llama-3.2-1B shape": str(big)}


def main() -> int:
    """Run every check, then print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--model", help="a local model of the default shape (else random weights)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    started = time.perf_counter()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    workdir = Path(tempfile.mkdtemp(prefix="spyglass-gpu-check-"))
    models = build_models(args.model, workdir)
    os.environ["SPYGLASS_DEFAULT_MODEL"] = models["default shape"]
    os.environ.setdefault("SPYGLASS_CACHE_DIR", str(workdir / "cache"))
    print(f"models: {models} (built in {time.perf_counter() - started:.0f} s)")
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/kernels", "tests/core"],
        check=False,
    )
    check_kernels_against_torch()
    prompts = [
        "The capital of France is",
        "def quicksort(xs):",
        "写一首关于秋天的诗",
        "Explain CUDA graphs.",
    ]
    _, cpu_tokens = engine_tokens("float32", False, "cpu", prompts)
    _, eager_tokens = engine_tokens("float32", False, "cuda", prompts)
    _, graph_tokens = engine_tokens("float32", True, "cuda", prompts)
    print(
        "parity fp32: cpu == cuda eager:",
        cpu_tokens == eager_tokens,
        "| eager == graphs:",
        eager_tokens == graph_tokens,
    )
    engines = {
        "eager": LLMEngine(EngineConfig(dtype="bfloat16", cuda_graphs=False, max_num_seqs=256)),
        "graphs": LLMEngine(EngineConfig(dtype="bfloat16", cuda_graphs=True, max_num_seqs=256)),
    }
    bandwidth = copy_bandwidth()
    attention = attention_table(bandwidth, args.quick)
    steps = decode_step_table(engines, args.quick)
    capture = engines["graphs"].runner.graphs.capture_seconds
    for engine in engines.values():
        engine.shutdown()
    del engines
    gc.collect()
    torch.cuda.empty_cache()
    phases = step_phase_table(
        models["default shape"], "cuda", (1, 64) if args.quick else (1, 64, 256)
    )
    throughput = throughput_table(models, "cuda", 16 if args.quick else None)
    serving = serving_table(models["default shape"], "cuda", 64 if args.quick else 256)
    print(f"\nmeasured copy bandwidth {bandwidth / 1e9:.0f} GB/s\n")
    print("\n".join(attention))
    print()
    print("\n".join(steps))
    print(f"\ncapture time {capture:.2f} s\n")
    print("\n".join(phases))
    print()
    print("\n".join(throughput))
    print()
    print("\n".join(serving))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
