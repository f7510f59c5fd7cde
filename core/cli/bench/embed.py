"""``spyglass bench embed``: embedding throughput against HF transformers, and their agreement.

A seeded set of prompts of mixed lengths is embedded (last-token pooling, unit vectors) by
Spyglass's continuous batching (`LLMEngine` with `pooling_request_params`, chunked prefill within
``--max-num-batched-tokens``) and by HF ``AutoModel`` over padded batches in a child process
(`hf_embed`), on the same weights in the same dtype: by default float32 and, for a GGUF file,
its weights dequantized (``--quantization none``), so both compute the same thing. Each side runs
``--repeats`` times, alternating which goes first, and the medians are compared. The agreement is
the smallest cosine similarity between the two sides' vectors over the prompts.
"""

import gc
import time
from dataclasses import dataclass

import numpy as np
import torch

from spyglass.core.cli.bench.hf_embed import HFEmbedder
from spyglass.core.cli.bench.workloads import FIRST_ORDINARY_TOKEN
from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import pooling_request_params


def add_parser(subparsers, argv) -> None:
    """Register ``bench embed``."""
    parser = subparsers.add_parser(
        "embed", help="embedding throughput and agreement against HF transformers"
    )
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--min-prompt-len", type=int, default=16)
    parser.add_argument("--max-prompt-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side; medians compared")
    parser.add_argument("--hf-batch-size", type=int, default=8, help="prompts per HF batch")
    parser.add_argument(
        "--hf-order",
        default="length",
        choices=["length", "given"],
        help="batch HF's prompts by length (little padding, as sentence-transformers does) or as given",
    )
    add_engine_arguments(parser)
    # Both sides compute the same thing by default: float32 on the GGUF file's dequantized weights
    # (its quantized kernels round activations to int8: min cosine 0.9992 on the default prompts).
    parser.set_defaults(dtype="float32", quantization="none", run=run)


@dataclass(frozen=True, slots=True)
class EmbedRun:
    """One timed pass over the prompts."""

    seconds: float
    num_prompts: int
    num_prompt_tokens: int

    @property
    def prompts_per_s(self) -> float:
        """Prompts embedded per second."""
        return self.num_prompts / self.seconds

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens embedded per second."""
        return self.num_prompt_tokens / self.seconds


@dataclass(frozen=True, slots=True)
class EmbedComparison:
    """The median run of each side, the smallest cosine similarity between their vectors over
    the prompts, and the pad tokens HF's batches held beside the prompt tokens."""

    spyglass: EmbedRun
    hf: EmbedRun
    min_cosine: float
    hf_pad_tokens: int

    @property
    def speedup(self) -> float:
        """Spyglass's throughput over HF's (prompts and prompt tokens alike)."""
        return self.hf.seconds / self.spyglass.seconds


def embed_prompts(
    vocab_size: int, num_prompts: int, min_len: int, max_len: int, seed: int
) -> list[list[int]]:
    """Random prompts of lengths drawn uniformly from ``min_len..max_len``, the same for a seed."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=num_prompts)
    return [rng.integers(FIRST_ORDINARY_TOKEN, vocab_size, size=n).tolist() for n in lengths]


def embed_on_engine(engine: LLMEngine, prompts: list[list[int]]) -> tuple[float, torch.Tensor]:
    """Embed every prompt on ``engine`` at once (unit vectors); the seconds from the first request
    to the last vector, and the vectors ``[num prompts, hidden]`` in prompt order."""
    params = pooling_request_params(PoolingParams(normalize=True))
    vectors: list[list[float] | None] = [None] * len(prompts)
    start = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.add_request(f"embed-{index}", prompt, params)
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                vectors[int(output.request_id.removeprefix("embed-"))] = output.pooled
    seconds = time.perf_counter() - start
    if any(vector is None for vector in vectors):
        raise RuntimeError("an embedding request finished without its vector")
    return seconds, torch.tensor(vectors)


def _median(runs: list[EmbedRun]) -> EmbedRun:
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def _spyglass_run(config: EngineConfig, prompts: list[list[int]]) -> tuple[float, torch.Tensor]:
    """`embed_on_engine` on a fresh engine (its prefix cache would serve a repeat), shut down after."""
    gc.collect()  # the last engine and its KV cache go before this one loads
    engine = LLMEngine(config)
    try:
        return embed_on_engine(engine, prompts)
    finally:
        engine.shutdown()


def compare(args) -> EmbedComparison:
    """Time both sides ``args.repeats`` times, alternating which goes first; print the set-up first."""
    config = engine_config_from_args(args)
    probe = LLMEngine(config)
    print(
        f"model {probe.model_name} dtype {probe.info.dtype} quantization {probe.info.quantization} "
        f"device {probe.info.device} threads {torch.get_num_threads()} "
        f"max_num_batched_tokens {config.max_num_batched_tokens} pooling {probe.pooling_type}"
    )
    vocab_size, device, pooling_type = probe.arch.vocab_size, probe.device.type, probe.pooling_type
    probe.shutdown()
    del probe
    prompts = embed_prompts(
        vocab_size, args.num_prompts, args.min_prompt_len, args.max_prompt_len, args.seed
    )
    num_tokens = sum(len(p) for p in prompts)
    runs: dict[str, list[EmbedRun]] = {"spyglass": [], "hf": []}
    by_length = args.hf_order == "length"
    with HFEmbedder(
        args.model,
        config.torch_dtype(),
        prompts,
        args.hf_batch_size,
        by_length,
        device,
        pooling_type,
    ) as hf:
        for repeat in range(args.repeats):
            for side in ("spyglass", "hf") if repeat % 2 == 0 else ("hf", "spyglass"):
                if side == "hf":
                    hf_pass = hf.run()
                    seconds = hf_pass.seconds
                else:
                    seconds, spyglass_vectors = _spyglass_run(config, prompts)
                runs[side].append(EmbedRun(seconds, len(prompts), num_tokens))
    cosines = (spyglass_vectors * hf_pass.embeddings).sum(dim=-1)
    return EmbedComparison(
        _median(runs["spyglass"]), _median(runs["hf"]), cosines.min().item(), hf_pass.num_pad_tokens
    )


def run(args) -> int:
    """Compare both sides on the seeded prompts and print the medians, the ratio and the agreement."""
    report(args, compare(args))
    return 0


def report(args, result: EmbedComparison) -> None:
    """Print ``result``: a row per side, Spyglass's throughput over HF's, and the agreement."""
    spyglass = result.spyglass
    print(
        f"\nembed: {spyglass.num_prompts} prompts of {args.min_prompt_len} to {args.max_prompt_len} "
        f"tokens (seed {args.seed}), {spyglass.num_prompt_tokens} prompt tokens "
        f"(median of {args.repeats} runs)"
    )
    hf_label = f"hf (batches of {args.hf_batch_size}, {args.hf_order} order)"
    print(f"{'engine':<34}{'seconds':>9}{'prompts/s':>11}{'prompt tok/s':>14}")
    for label, side in (("spyglass", spyglass), (hf_label, result.hf)):
        print(
            f"{label:<34}{side.seconds:>9.2f}{side.prompts_per_s:>11.1f}"
            f"{side.prompt_tokens_per_s:>14.1f}"
        )
    padding = result.hf_pad_tokens / (result.hf_pad_tokens + spyglass.num_prompt_tokens)
    print(f"spyglass / hf embedding throughput: {result.speedup:.2f}x")
    print(
        f"agreement: min cosine similarity {result.min_cosine:.6f} over {spyglass.num_prompts} "
        f"prompts; HF's batches were {padding:.1%} padding"
    )
