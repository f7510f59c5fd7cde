"""Peer benchmark: llama.cpp (llama-cpp-python) batch-1 decode on the default model's own GGUF.

The same measurement as ``spyglass bench latency``'s baseline row: each prompt of its copy and
open workloads, chat-formatted with the model's template, greedy, ``--max-tokens`` tokens, one
request at a time; decode ms per token is the time after the first token divided by the tokens
after it. Prints the median over ``--repeats`` rounds, and the seconds from ``Llama(...)`` to a
loaded model (llama.cpp maps the GGUF; Spyglass's figure is the time to its "engine started" line).

    python3 -m venv /tmp/llama-venv && /tmp/llama-venv/bin/pip install llama-cpp-python  # ~10 min build
    python3 -c "import json; from spyglass.core.cli.bench.latency import WORKLOADS; print(json.dumps(WORKLOADS))" \
        > /tmp/latency_prompts.json
    /tmp/llama-venv/bin/python examples/peer_bench/llama_cpp_bench.py --prompts /tmp/latency_prompts.json \
        --model ~/.cache/spyglass/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

from llama_cpp import Llama


def decode_ms_per_token(llm: Llama, prompt: str, max_tokens: int) -> float:
    """Greedy chat completion of ``prompt``; ms per token after the first."""
    times = []
    stream = llm.create_chat_completion(
        [{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0, stream=True
    )
    for chunk in stream:
        if chunk["choices"][0]["delta"].get("content"):
            times.append(time.perf_counter())
    return (times[-1] - times[0]) * 1e3 / max(len(times) - 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument(
        "--prompts", required=True, help="JSON {workload: [prompt, ...]} (spyglass bench latency's)"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    start = time.perf_counter()
    llm = Llama(args.model, n_ctx=2048, n_threads=args.threads, n_batch=512, verbose=False)
    print(f"llama.cpp ready in {time.perf_counter() - start:.2f} s ({args.threads} threads)")
    workloads = json.loads(Path(args.prompts).read_text())
    samples = {workload: [] for workload in workloads}
    for _ in range(args.repeats):
        for workload, prompts in workloads.items():
            samples[workload] += [
                decode_ms_per_token(llm, prompt, args.max_tokens) for prompt in prompts
            ]
    for workload, values in samples.items():
        print(
            f"{workload:<6} batch 1 decode: {statistics.median(values):.1f} ms per token (median of {len(values)})"
        )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
