"""Triton RMSNorm-with-residual and in-place rotary embedding: CUDA twins of `torch_norm_rope`, same signatures."""

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    stride_x,
    stride_r,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per token row: sum, store the sum, normalise it in fp32, scale by the weight."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    summed = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        summed += tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    # Normalise the sum as stored (rounded to the model dtype), as the torch version does.
    summed = summed.to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * hidden + cols, summed, mask=mask)
    s = summed.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(s * s, axis=0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * hidden + cols, (s * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask
    )


@triton.jit
def _rotary_kernel(
    x_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    stride_t,
    stride_h,
    stride_d,
    stride_table,
    num_heads,
    half,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """One program per token rotates all its heads; each half is read once and written once."""
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < num_heads) & (dims < half)
    # Both halves of a table row hold the same angles, so the first half is enough.
    c = tl.load(cos_ptr + pos * stride_table + dims, mask=dims < half).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_table + dims, mask=dims < half).to(tl.float32)
    lo_ptr = x_ptr + token * stride_t + heads * stride_h + dims * stride_d
    hi_ptr = lo_ptr + half * stride_d
    lo = tl.load(lo_ptr, mask=mask).to(tl.float32)
    hi = tl.load(hi_ptr, mask=mask).to(tl.float32)
    tl.store(lo_ptr, (lo * c - hi * s).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(hi_ptr, (hi * c + lo * s).to(x_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add ``residual`` (when given) to ``x`` and RMS-normalise the sum; see `torch_norm_rope.add_rms_norm`.

    Rows of ``x`` and ``residual`` may be strided, but each row must be contiguous.
    """
    num_tokens, hidden = x.shape
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out)
    if num_tokens == 0:
        return out, summed
    assert x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1), (
        "rows must be contiguous"
    )
    _add_rms_norm_kernel[(num_tokens,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        summed,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(hidden),
    )
    return out, summed


def rotary_embedding_(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Rotate ``x`` in place by each token's position; see `torch_norm_rope.rotary_embedding_`."""
    num_tokens, num_heads, head_dim = x.shape
    if num_tokens == 0:
        return
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1, (
        "cos and sin must be row-contiguous alike"
    )
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        x,
        positions,
        cos,
        sin,
        *x.stride(),
        cos.stride(0),
        num_heads,
        half,
        HEADS_PAD=triton.next_power_of_2(num_heads),
        HALF_PAD=triton.next_power_of_2(half),
    )
