"""One-shot GPU check: kernels and model parity on the device, attention bandwidth, CUDA-graph
timings, W1/W3 throughput at two model shapes against HF transformers on the same GPU, and W3
served over HTTP with the engine in a thread and in a process of its own, against offline.

    python examples/gpu_check.py [--quick] [--model PATH]

Runs offline from a copy of the checkout: without ``--model`` it builds the default model's shape
with random weights and the real tokenizer (`examples/gpu_model`, shipped configs), and always a
Llama-3.2-1B shape; ``SPYGLASS_DEFAULT_MODEL`` points every engine and the GPU tests at the first.
Prints each table as it is measured (``--out FILE`` appends them there too) and all of them
again at the end (about 5 minutes on an H200). Without CUDA it says so and exits 1.
"""

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from spyglass.core.cli.bench import step_phases, verify_cost
from spyglass.core.cli.bench.hf_static import HFStaticBatching
from spyglass.core.cli.bench.throughput import run_engine
from spyglass.core.cli.bench.workloads import w1_workload, w3_workload
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput

# examples/gpu_model is a folder of files, not a package: its builder is imported by path, and so
# are this script's neighbours.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "gpu_model"))
import random_model
from gpu_arrivals import arrival_table
from gpu_attention import (
    attention_table,
    bandwidth_rows,
    kernel_error_against_torch,
    mixed_step_table,
    split_count_table,
    tiling_sweep_table,
)
from gpu_report import Report
from gpu_serving import serving_table


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
    "off": {"async_output": False, "async_scheduling": False},
    "output": {"async_output": True, "async_scheduling": False},
    "scheduling": {"async_output": True, "async_scheduling": True},
}


SAMPLING = {"temperature": 0.7, "top_p": 0.9}
"""What the sampled rows of the step table ask: a chat client's usual settings."""

PENALISED = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
"""Qwen2.5's generation_config.json: a repetition penalty on every request (before the
thirty-first session it turned async scheduling off)."""

GRAMMAR = {**SAMPLING, "structured_output": StructuredOutput("json_object")}
"""Every request's output a JSON object (before the thirty-second session a grammar turned async
scheduling off; now its steps are forwarded ahead and sampled once the step before is committed)."""


def step_phase_table(
    model: str,
    device: str,
    batches: tuple[int, ...],
    steps: dict | None = None,
    modes: tuple[str, ...] = tuple(STEP_MODES),
    sampling: dict | None = None,
) -> list[str]:
    """Decode steps of ``model`` (bf16, CUDA graphs on ``device``) split into host phases and the
    wait for the device (`spyglass bench steps`), and the share that replayed a graph, in each of
    ``modes``: none, async output, and
    async scheduling too; greedy unless ``sampling`` says otherwise. ``steps``, when given, gets
    each (mode, batch)'s step seconds."""
    rows = [
        "| async | batch | step ms | " + " | ".join(step_phases.PHASES) + " | graphed |",
        "|---" * (4 + len(step_phases.PHASES)) + "|",
    ]
    for mode in modes:
        options = STEP_MODES[mode]
        config = EngineConfig(
            model=model, dtype="bfloat16", device=device, max_num_seqs=256, **options
        )
        engine = LLMEngine(config)
        for batch in batches:
            seconds = step_phases.phase_medians(engine, batch, 32, 64, sampling=sampling)
            if steps is not None:
                steps[mode, batch] = seconds["step"]
            ms = {k: v * 1e3 for k, v in seconds.items()}
            rows.append(
                f"| {mode} | {batch} | {ms['step']:.2f} | "
                + " | ".join(f"{ms[phase]:.2f}" for phase in step_phases.PHASES)
                + f" | {seconds['graphed']:.0%} |"
            )
        engine.shutdown()
    return rows


def verify_cost_rows(model: str, device: str, rounds: int = 3) -> list[str]:
    """A step verifying L drafts for one greedy request against a plain decode step (`spyglass
    bench latency --verify-cost`), bf16 with CUDA graphs: since the thirty-second session the
    drafts are verified on the device and the step is not finished at launch."""
    config = EngineConfig(
        model=model, dtype="bfloat16", device=device, speculative="ngram", num_speculative_tokens=4
    )
    engine = LLMEngine(config)
    costs = verify_cost.verification_costs(engine, list(range(100, 132)), 4, rounds)
    engine.shutdown()
    return ["| drafts | ms/step | x plain |", "|---|---|---|"] + [
        f"| {length} | {seconds * 1e3:.2f} | {seconds / costs[0]:.2f}x |"
        for length, seconds in costs.items()
    ]


def weight_read_rows(model: str, device: str, bandwidth: float) -> list[str]:
    """Item 3's target: ``model``'s decode step at batch 64 (`step_phase_table`) against the time
    its weights take to read at the measured copy bandwidth."""
    steps: dict = {}
    rows = step_phase_table(model, device, (64,), steps)
    weight_bytes = sum(path.stat().st_size for path in Path(model).glob("*.safetensors"))
    read = weight_bytes / bandwidth
    best = min(steps.values())
    return rows + [
        "",
        f"weights {weight_bytes / 1e9:.2f} GB, read in {read * 1e3:.2f} ms at copy bandwidth; "
        f"fastest step {best * 1e3:.2f} ms = {best / read:.1f}x the read (target: within 2x)",
    ]


def throughput_rows(shape: str, model: str, device: str, num_requests: int | None) -> list[str]:
    """W1 and W3 output tokens/s on ``model`` (bf16, CUDA graphs on ``device``), with async output
    only and with async scheduling (the default with CUDA), and HF transformers' static batching on W1 on the same
    device; ``num_requests`` shrinks both workloads (None: full)."""
    ours = {}
    for mode in ("output", "scheduling"):
        engine = LLMEngine(
            EngineConfig(
                model=model,
                dtype="bfloat16",
                device=device,
                max_num_seqs=256,
                **STEP_MODES[mode],
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
    best = max(ours["W1", mode].output_tokens_per_s for mode in ("output", "scheduling"))
    return [f"| {shape} | {' | '.join(cells)} | {best / hf.output_tokens_per_s:.2f}x |"]


def throughput_table(models: dict[str, str], device: str, num_requests: int | None) -> list[str]:
    """`throughput_rows` for every shape, under one header."""
    rows = [
        "| shape | W1, async output only | W3, async output only | W1, async scheduling "
        "| W3, async scheduling "
        "| HF static W1 | best W1 vs HF |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, model in models.items():
        rows += throughput_rows(shape, model, device, num_requests)
    return rows


def build_models(model: str | None, directory: Path) -> dict[str, str]:
    """The default shape (``model`` when given, else random weights) and the 1B shape, built on the GPU."""
    default = model or str(random_model.build("default", directory / "default", device="cuda"))
    big = random_model.build("1b", directory / "1b", device="cuda")
    return {"default shape": default, "Llama-3.2-1B shape": str(big)}


def gpu_tests(log: Path, timeout_s: float) -> list[str]:
    """The GPU-marked tests of the kernels and the core (on ``SPYGLASS_DEFAULT_MODEL``), stopped
    after ``timeout_s``: pytest's output (kept in ``log``) printed, its failures and last line as rows."""
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/kernels", "tests/core"]
    with log.open("w") as output:
        try:
            subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, timeout=timeout_s)
            stopped = []
        except subprocess.TimeoutExpired:
            stopped = [f"stopped after {timeout_s:.0f} s"]
    text = log.read_text()
    print(text, flush=True)
    lines = [line for line in text.splitlines() if line.strip()]
    return [line for line in lines if line.startswith(("FAILED", "ERROR"))] + lines[-1:] + stopped


def parity_rows(prompts: list[str]) -> list[str]:
    """The Triton kernels against torch, and greedy fp32 tokens on the CPU, CUDA eager and CUDA graphs."""
    error = kernel_error_against_torch()
    _, cpu_tokens = engine_tokens("float32", False, "cpu", prompts)
    _, eager_tokens = engine_tokens("float32", False, "cuda", prompts)
    _, graph_tokens = engine_tokens("float32", True, "cuda", prompts)
    return [
        f"triton vs torch paged attention, fp32 max abs error {error:.2e} "
        f"({'within' if error < 1e-4 else 'ABOVE'} 1e-4)",
        f"greedy fp32 tokens on {len(prompts)} prompts: cpu == cuda eager: "
        f"{cpu_tokens == eager_tokens}, eager == graphs: {eager_tokens == graph_tokens}",
    ]


def decode_step_rows(quick: bool) -> list[str]:
    """`decode_step_table` on the default model, eager and with CUDA graphs, and the capture time."""
    engines = {
        "eager": LLMEngine(EngineConfig(dtype="bfloat16", cuda_graphs=False, max_num_seqs=256)),
        "graphs": LLMEngine(EngineConfig(dtype="bfloat16", cuda_graphs=True, max_num_seqs=256)),
    }
    try:
        rows = decode_step_table(engines, quick)
        return rows + ["", f"capture time {engines['graphs'].runner.graphs.capture_seconds:.2f} s"]
    finally:
        for engine in engines.values():
            engine.shutdown()


def main() -> int:
    """Run every check, printing each table as it is measured, then all of them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--model", help="a local model of the default shape (else random weights)")
    parser.add_argument(
        "--out", type=Path, help="also append each table to this file as it is measured"
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated words: sections whose title holds one are skipped",
    )
    parser.add_argument(
        "--profile-serving",
        type=Path,
        help="sample the serving table's processes with py-spy into this folder",
    )
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
    report = Report(args.out, tuple(word for word in args.skip.split(",") if word))
    prompts = [
        "The capital of France is",
        "def quicksort(xs):",
        "写一首关于秋天的诗",
        "Explain CUDA graphs.",
    ]
    # Most wanted first: a run cut short by its time limit loses the last sections.
    report.section("kernels and parity", lambda: parity_rows(prompts))
    # The copy bandwidth, which the attention tables and the weights' read are put against.
    measured: dict[str, float] = {}
    report.section("copy bandwidth", lambda: bandwidth_rows(measured))
    report.section("decode attention", lambda: attention_table(measured["bandwidth"], args.quick))
    report.section("GPU tests", lambda: gpu_tests(workdir / "gpu_tests.log", timeout_s=150))
    report.section(
        "throughput", lambda: throughput_table(models, "cuda", 16 if args.quick else None)
    )
    report.section(
        "serving W3",
        lambda: serving_table(
            models["default shape"], "cuda", 64 if args.quick else 256, args.profile_serving
        ),
    )
    report.section(
        "Llama-3.2-1B shape: decode step at batch 64 against its weights' read",
        lambda: weight_read_rows(models["Llama-3.2-1B shape"], "cuda", measured["bandwidth"]),
    )
    batches = (1, 64) if args.quick else (1, 64, 256)
    report.section(
        "decode step phases, default shape",
        lambda: step_phase_table(models["default shape"], "cuda", batches),
    )
    report.section(
        f"decode step phases, default shape, sampling {SAMPLING}",
        lambda: step_phase_table(
            models["default shape"], "cuda", (1, 64), modes=("scheduling",), sampling=SAMPLING
        ),
    )
    report.section(
        f"decode step phases, default shape, sampling {PENALISED}",
        lambda: step_phase_table(
            models["default shape"], "cuda", (1, 64), modes=("scheduling",), sampling=PENALISED
        ),
    )
    report.section(
        "decode step phases, default shape, every request a JSON object",
        lambda: step_phase_table(
            models["default shape"],
            "cuda",
            (1, 64),
            modes=("output", "scheduling"),
            sampling=GRAMMAR,
        ),
    )
    report.section(
        "speculation: verifying L drafts at batch 1, default shape",
        lambda: verify_cost_rows(models["default shape"], "cuda"),
    )
    report.section(
        "steps while requests arrive (a 128-token prompt a step): eager vs packed CUDA graphs",
        lambda: arrival_table(models),
    )
    report.section(
        "decode attention tilings (tile positions / warps / stages)",
        lambda: tiling_sweep_table(measured["bandwidth"], args.quick),
    )
    report.section(
        "split-K partitions at small batches (partitions: of copy bw)",
        lambda: split_count_table(measured["bandwidth"]),
    )
    report.section(
        "attention of a prompt chunk among decodes (query tiles padded vs packed)",
        mixed_step_table,
    )
    report.section("decode step, eager vs CUDA graphs", lambda: decode_step_rows(args.quick))
    print("\n# every table\n")
    print("\n".join(report.lines))
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
