"""Choice of kernel set: Triton on CUDA, compiled C++ kernels on the CPU, pure torch as the reference.

Triton is imported only when its backend is selected, so CPU installs without triton keep working.
"""

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spyglass.kernels import (
    cpu_attention,
    cpu_layer_ops,
    cpu_moe,
    cpu_native,
    torch_attention,
    torch_moe,
    torch_norm_rope,
)

_CHOICES = ("auto", "cpu", "torch", "triton")


@dataclass(frozen=True)
class AttentionBackend:
    """One consistent set of kernels: KV store and paged attention (contract: `torch_attention`),
    the elementwise layer ops (contract: `torch_norm_rope`) and the grouped MoE experts (contract:
    `torch_moe.fused_experts`)."""

    name: str
    store_kv: Callable
    paged_attention: Callable
    cache_shape: Callable[[int, int, int, int], tuple[int, ...]] = torch_attention.cache_shape
    add_rms_norm: Callable = torch_norm_rope.add_rms_norm
    rotary_embedding_: Callable = torch_norm_rope.rotary_embedding_
    silu_and_mul: Callable = torch_norm_rope.silu_and_mul
    gelu_tanh_and_mul: Callable = torch_norm_rope.gelu_tanh_and_mul
    fused_experts: Callable = torch_moe.fused_experts
    warm_up_shapes: Callable[[], tuple[tuple[int, ...], int]] | None = None
    """For kernels compiled on first use (Triton): (query lengths, a decode context length) whose
    steps between them use every variant, for the runner to run once before serving."""


def _torch_backend() -> AttentionBackend:
    """The pure-torch implementations."""
    return AttentionBackend("torch", torch_attention.store_kv, torch_attention.paged_attention)


def _cpu_backend() -> AttentionBackend:
    """The CPU fast path: compiled kernels over a head-major cache (tested against the torch references).

    The kernels are built here, when the engine starts, rather than inside its first step. Where
    they cannot be built the name says so ("cpu-torch"): it reaches the engine-started hook and log.
    """
    name = "cpu" if cpu_native.build() else "cpu-torch"
    return AttentionBackend(
        name,
        cpu_attention.store_kv,
        cpu_attention.paged_attention,
        cpu_attention.cache_shape,
        cpu_layer_ops.add_rms_norm,
        cpu_layer_ops.rotary_embedding_,
        cpu_layer_ops.silu_and_mul,
        fused_experts=cpu_moe.fused_experts,
    )


def _triton_backend() -> AttentionBackend:
    """The Triton kernels, importing triton now; raises ImportError with a hint when it is missing."""
    if importlib.util.find_spec("triton") is None:
        raise ImportError(
            "the triton attention backend needs the 'triton' package (pip install 'spyglass[gpu]')"
        )
    store = importlib.import_module("spyglass.kernels.triton_store_kv")
    attention = importlib.import_module("spyglass.kernels.triton_attention")
    norm_rope = importlib.import_module("spyglass.kernels.triton_norm_rope")
    moe = importlib.import_module("spyglass.kernels.triton_moe")
    return AttentionBackend(
        "triton",
        store.store_kv,
        attention.paged_attention,
        add_rms_norm=norm_rope.add_rms_norm,
        rotary_embedding_=norm_rope.rotary_embedding_,
        fused_experts=moe.fused_experts,
        warm_up_shapes=attention.warm_up_shapes,
    )


def select_backend(device: torch.device, force: str | None = None) -> AttentionBackend:
    """Pick the attention backend for ``device``.

    ``force`` None or "auto" means triton on CUDA and the CPU fast path otherwise; "cpu", "torch"
    (the reference) and "triton" override that (triton without CUDA only under ``TRITON_INTERPRET=1``).
    """
    choice = force or "auto"
    if choice not in _CHOICES:
        raise ValueError(
            f"unknown attention backend {force!r}; expected one of {', '.join(_CHOICES)}"
        )
    if choice == "auto":
        choice = "triton" if torch.device(device).type == "cuda" else "cpu"
    return {"triton": _triton_backend, "cpu": _cpu_backend, "torch": _torch_backend}[choice]()
