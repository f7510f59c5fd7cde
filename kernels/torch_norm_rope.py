"""Pure-torch layer ops (RMSNorm with residual, in-place rotary, SiLU- and GELU-and-mul): the kernels' references."""

import torch
import torch.nn.functional as F


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add ``residual`` (when given) to ``x`` and RMS-normalise the sum over the last dim.

    Args:
        x, residual: ``[num_tokens, hidden]``, same dtype.
        weight: ``[hidden]`` scale.

    Returns:
        ``(rms_norm(x + residual) * weight, x + residual)``, both in ``x``'s dtype; the sum is the new
        residual stream.
    """
    summed = x if residual is None else x + residual
    return F.rms_norm(summed, summed.shape[-1:], weight, eps), summed


def rotary_embedding_(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Rotate ``x`` in place by each token's position, in the rotate-half (HF / NeoX) layout.

    Args:
        x: ``[num_tokens, num_heads, head_dim]``, any strides (typically a view of the fused qkv output).
        positions: ``[num_tokens]`` integer positions.
        cos, sin: ``[max_positions, head_dim]`` tables whose two halves repeat the same angles.
    """
    half = x.shape[-1] // 2
    c, s = cos[positions].unsqueeze(1).float(), sin[positions].unsqueeze(1).float()
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    x.copy_(xf * c + rotated * s)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` of shape ``[num_tokens, 2 * width]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` (GeGLU, Gemma) for ``gate_up = [gate | up]`` of shape ``[num_tokens, 2 * width]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
