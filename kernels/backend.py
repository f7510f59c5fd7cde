"""Choice of attention implementation: Triton kernels on CUDA, pure torch elsewhere.

Triton is imported only when its backend is selected, so CPU installs without triton keep working.
"""

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from spyglass.kernels import cpu_attention, torch_attention

_CHOICES = ("auto", "cpu", "torch", "triton")


@dataclass(frozen=True)
class AttentionBackend:
    """One consistent pair of KV-store and paged-attention functions (see `torch_attention` for their contract)."""

    name: str
    store_kv: Callable
    paged_attention: Callable
    cache_shape: Callable[[int, int, int, int], tuple[int, ...]] = torch_attention.cache_shape


def _torch_backend() -> AttentionBackend:
    """The pure-torch implementations."""
    return AttentionBackend("torch", torch_attention.store_kv, torch_attention.paged_attention)


def _cpu_backend() -> AttentionBackend:
    """The CPU fast path over a head-major cache (tested against the torch reference)."""
    return AttentionBackend("cpu", cpu_attention.store_kv, cpu_attention.paged_attention, cpu_attention.cache_shape)


def _triton_backend() -> AttentionBackend:
    """The Triton kernels, importing triton now; raises ImportError with a hint when it is missing."""
    if importlib.util.find_spec("triton") is None:
        raise ImportError("the triton attention backend needs the 'triton' package (pip install 'spyglass[gpu]')")
    store = importlib.import_module("spyglass.kernels.triton_store_kv")
    attention = importlib.import_module("spyglass.kernels.triton_attention")
    return AttentionBackend("triton", store.store_kv, attention.paged_attention)


def select_backend(device: torch.device, force: str | None = None) -> AttentionBackend:
    """Pick the attention backend for ``device``.

    ``force`` None or "auto" means triton on CUDA and the CPU fast path otherwise; "cpu", "torch"
    (the reference) and "triton" override that (triton without CUDA only under ``TRITON_INTERPRET=1``).
    """
    choice = force or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"unknown attention backend {force!r}; expected one of {', '.join(_CHOICES)}")
    if choice == "auto":
        choice = "triton" if torch.device(device).type == "cuda" else "cpu"
    return {"triton": _triton_backend, "cpu": _cpu_backend, "torch": _torch_backend}[choice]()
