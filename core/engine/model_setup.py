"""An engine's model as its configuration asks: weights quantized or not, on one rank or several,
and the line that says how it started."""

import logging
from dataclasses import replace

import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.runner.cuda_graphs import token_buckets
from spyglass.core.engine.runner.model_runner import ModelRunner
from spyglass.core.engine.step_stats import EngineInfo
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.load import load_checkpoint
from spyglass.core.models.linear import DualLinear
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.quantization import (
    check_dense_copies,
    quantize_weights_int8,
    resolve_mode,
    weight_bytes,
    with_dense_copies,
)
from spyglass.core.models.registry import build_model
from spyglass.kernels import cpu_isa
from spyglass.kernels.backend import AttentionBackend

log = logging.getLogger("spyglass.engine")


def warn_if_bf16_is_emulated(device: torch.device, dtype: torch.dtype) -> None:
    """bf16 on a CPU without native bf16 arithmetic runs (emulated), with a warning."""
    if device.type == "cpu" and dtype == torch.bfloat16 and not cpu_isa.has_native_bf16():
        log.warning(
            "bfloat16 asked for, but this CPU (%s) has no native bf16 arithmetic: it is emulated and several "
            "times slower than --dtype float32",
            cpu_isa.describe(),
        )


def prepare_weights(
    config: EngineConfig, dtype: torch.dtype, device: torch.device, checkpoint: Checkpoint | None
) -> tuple[Checkpoint, str]:
    """``checkpoint`` (loaded from ``config.model`` when None) in the form the quantization mode
    in force wants, and that mode."""
    quantization = resolve_mode(config.quantization, device)
    checkpoint = checkpoint or load_checkpoint(
        config.model, dtype, keep_quantized=quantization in ("auto", "dual")
    )
    if quantization == "int8":
        return replace(checkpoint, weights=quantize_weights_int8(checkpoint.weights)), quantization
    if quantization == "dual":
        if config.tensor_parallel_size > 1:
            raise ValueError("--quantization dual does not combine with tensor parallelism")
        check_dense_copies(checkpoint.weights, dtype)
        return replace(
            checkpoint, weights=with_dense_copies(checkpoint.weights, dtype)
        ), quantization
    return checkpoint, quantization


def build_runnable_model(
    checkpoint: Checkpoint, backend: AttentionBackend, device: torch.device, config: EngineConfig
) -> tuple[torch.nn.Module, type[ModelRunner]]:
    """The model on this process (or on ``config.tensor_parallel_size`` ranks) and the runner class
    that drives it."""
    if config.tensor_parallel_size == 1:
        return build_model(checkpoint.arch, checkpoint.weights, backend, device), ModelRunner
    if not checkpoint.arch.has_lm_head:
        raise ValueError("an embedding model (no LM head) runs without tensor parallelism")
    if checkpoint.arch.vision is not None:
        raise ValueError("a vision model (images in prompts) runs without tensor parallelism")
    # imported here: torch.distributed would slow every other start
    from spyglass.core.engine.runner.parallel import ParallelModelRunner, launch_tensor_parallel

    return launch_tensor_parallel(checkpoint, backend, device, config), ParallelModelRunner


def prepare_device_steps(
    runner: ModelRunner, config: EngineConfig, device: torch.device, max_model_len: int
) -> None:
    """On CUDA, compile every kernel variant a step can need (nothing compiles while serving) and
    capture the CUDA graphs ``config`` asks for; nothing to do on the CPU, or for a base model
    (its steps are embeddings, run eagerly: the warm-up and the graphs run the head)."""
    if device.type != "cuda" or not runner.model.arch.has_lm_head:
        return
    if config.tensor_parallel_size == 1:
        seconds = runner.compile_kernels(config.max_num_batched_tokens, max_model_len)
        log.info("kernels compiled for every step shape in %.2f s", seconds)
    if config.cuda_graphs:
        # Verify steps (a token and its drafts per request) get graphs of their own.
        rows = (1, 1 + config.num_speculative_tokens) if config.speculative else (1,)
        # Inside a graph experts run densely: worth it for a decode batch, not a prompt chunk.
        tokens = 0 if runner.model.arch.num_experts else config.cuda_graph_tokens
        buckets = token_buckets(tokens, config.max_num_batched_tokens)
        seconds = runner.enable_cuda_graphs(config.max_num_seqs, max_model_len, rows, buckets)
        log.info("CUDA graph capture took %.2f s", seconds)


def model_tasks(arch: ModelArchConfig) -> tuple[str, ...]:
    """What a model answers, as its head decides: a causal LM generates and embeds, a
    classifier classifies and embeds, a base model only embeds."""
    if arch.num_labels:
        return ("classify", "embed")
    return ("generate", "embed") if arch.has_lm_head else ("embed",)


def log_started(info: EngineInfo, dtype_reason: str, weights: dict, block_size: int) -> None:
    """The engine's start line: model, device, instruction set, dtype and why, weights, KV cache."""
    log.info(
        "engine started: %s on %s (%s), %s (%s), weights %.0f MB (quantization %s), kernels %s, "
        "%d KV blocks of %d tokens (%s), async output %s, async scheduling %s, stream interval %d, "
        "tasks %s, pooling %s",
        info.model_name,
        info.device,
        info.kernels,
        info.dtype,
        dtype_reason,
        weight_bytes(weights) / 1e6,
        f"dual: blocks below {DualLinear.DENSE_FROM_ROWS} rows, bf16 from there"
        if info.quantization == "dual"
        else info.quantization,
        info.attention_backend,
        info.num_kv_blocks,
        block_size,
        info.kv_cache_dtype,
        "on" if info.async_output else "off",
        "on" if info.async_scheduling else "off",
        info.stream_interval,
        "+".join(info.tasks),
        info.pooling_type,
    )
