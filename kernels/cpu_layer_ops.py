"""The CPU backend's elementwise layer ops: the compiled kernels where they apply, else the torch references.

Same contracts as `torch_norm_rope`. The native path needs every tensor in one dtype (float32
or bfloat16) and contiguous rows; anything else takes the reference path.
"""

import torch

from spyglass.kernels import cpu_native, torch_norm_rope


def _native(*tensors: torch.Tensor | None) -> bool:
    dtype = tensors[0].dtype
    return cpu_native.available(dtype) and all(
        t is None or (t.dtype == dtype and t.stride(-1) == 1) for t in tensors
    )


def add_rms_norm(x, residual, weight, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual) * weight, x + residual)``; see `torch_norm_rope.add_rms_norm`."""
    if _native(x, residual, weight):
        return cpu_native.add_rms_norm(x, residual, weight, eps)
    return torch_norm_rope.add_rms_norm(x, residual, weight, eps)


def rotary_embedding_(x, positions, cos, sin) -> None:
    """Rotate ``x`` in place; see `torch_norm_rope.rotary_embedding_`."""
    if _native(x, cos, sin):
        cpu_native.rotary_embedding_(x, positions, cos, sin)
    else:
        torch_norm_rope.rotary_embedding_(x, positions, cos, sin)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``; see `torch_norm_rope.silu_and_mul`."""
    if _native(gate_up):
        return cpu_native.silu_and_mul(gate_up)
    return torch_norm_rope.silu_and_mul(gate_up)
