"""Triton grouped expert MLPs (fused_moe style); contract and reference: `torch_moe.fused_experts`.

The (token, k) pairs are sorted by expert on the device and each expert's rows padded to a multiple
of ``BLOCK_M`` (`align_by_expert`), so every row block belongs to one expert. Two grouped GEMMs then
run over a grid of (row block, column tile): gate and up together with the activation fused
(``h = act(x W_gate^T) * x W_up^T``), then down with the routing weight fused. Nothing is read back
to the host and the grid depends only on the shapes, so the layer can be captured in a CUDA graph.
The k contributions of each token are summed in float32 at the end (no atomics, deterministic).
"""

import torch
import triton
import triton.language as tl

from spyglass.kernels import torch_moe

_ACTIVATION_IDS = {"silu": 0, "gelu_tanh": 1}


def _dot_in_fp32(dtype: torch.dtype) -> bool:
    """Whether tl.dot must take fp32 operands: only bf16 under the interpreter, whose tl.dot multiplies bf16
    bit patterns as integers (as in `triton_attention`). On a GPU the operands stay bf16 (tensor cores)."""
    return dtype == torch.bfloat16 and triton.knobs.runtime.interpret


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, block_experts)``: pair indices sorted by expert, each expert's run padded to ``block_m``
    rows with the sentinel ``num_pairs``, and the expert of each row block (``num_experts`` past the end).

    Sizes depend only on the shapes (``num_pairs + num_experts * (block_m - 1)`` rows at most).
    """
    ids = topk_ids.flatten()
    num_pairs = ids.numel()
    sorted_pairs, counts = torch_moe.sort_by_expert(topk_ids, num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    sorted_experts = ids[sorted_pairs]
    rank = torch.arange(num_pairs, device=ids.device) - (counts.cumsum(0) - counts)[sorted_experts]
    max_rows = triton.cdiv(num_pairs + num_experts * (block_m - 1), block_m) * block_m
    rows = torch.full((max_rows,), num_pairs, dtype=torch.int64, device=ids.device)
    rows[(padded_end - padded)[sorted_experts] + rank] = sorted_pairs
    block_starts = torch.arange(0, max_rows, block_m, device=ids.device)
    block_experts = torch.searchsorted(padded_end, block_starts, right=True)
    return rows, block_experts


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _activate(g, ACTIVATION: tl.constexpr):
    if ACTIVATION == 0:
        return g * tl.sigmoid(g)
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    return 0.5 * g * (2.0 * tl.sigmoid(2.0 * inner))  # 1 + tanh(z) = 2 sigmoid(2z)


# The number of (token, expert) pairs changes every step: not specialised on (a value of 1 or a
# multiple of 16 would compile another variant while serving).
_VARYING = ("num_pairs",)


@triton.jit(do_not_specialize=_VARYING)
def _gate_up_kernel(
    x_ptr,
    x_stride,
    w13_ptr,
    rows_ptr,
    block_experts_ptr,
    h_ptr,
    num_pairs,
    top_k,
    num_experts,
    hidden,
    inter,
    ACTIVATION: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    if expert >= num_experts:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(rows_ptr + offs_m)
    valid = pairs < num_pairs
    tokens = tl.where(valid, pairs // top_k, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < inter
    gate_ptr = w13_ptr + expert.to(tl.int64) * 2 * inter * hidden
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < hidden
        a = tl.load(
            x_ptr + tokens[:, None] * x_stride + offs_k[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        w_mask = k_mask[:, None] & n_mask[None, :]
        w_gate = tl.load(
            gate_ptr + offs_n[None, :] * hidden + offs_k[:, None], mask=w_mask, other=0.0
        )
        w_up = tl.load(
            gate_ptr + (inter + offs_n[None, :]) * hidden + offs_k[:, None], mask=w_mask, other=0.0
        )
        acc_gate = _dot(a, w_gate, acc_gate, PRECISION, DOT_FP32)
        acc_up = _dot(a, w_up, acc_up, PRECISION, DOT_FP32)
    h = _activate(acc_gate, ACTIVATION) * acc_up
    tl.store(
        h_ptr + offs_m[:, None] * inter + offs_n[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=valid[:, None] & n_mask[None, :],
    )


@triton.jit(do_not_specialize=_VARYING)
def _down_kernel(
    h_ptr,
    w2_ptr,
    rows_ptr,
    block_experts_ptr,
    weights_ptr,
    y_ptr,
    num_pairs,
    num_experts,
    hidden,
    inter,
    PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    if expert >= num_experts:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(rows_ptr + offs_m)
    valid = pairs < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    down_ptr = w2_ptr + expert.to(tl.int64) * hidden * inter
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < inter
        a = tl.load(
            h_ptr + offs_m[:, None] * inter + offs_k[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            down_ptr + offs_n[None, :] * inter + offs_k[:, None],
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        acc = _dot(a, w, acc, PRECISION, DOT_FP32)
    routing = tl.load(weights_ptr + tl.where(valid, pairs, 0), mask=valid, other=0.0).to(tl.float32)
    safe_pairs = tl.where(valid, pairs, 0)
    tl.store(
        y_ptr + safe_pairs[:, None] * hidden + offs_n[None, :],
        acc * routing[:, None],
        mask=valid[:, None] & n_mask[None, :],
    )


def fused_experts(x, w13, w2, topk_weights, topk_ids, activation: str = "silu") -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])``; see `torch_moe.fused_experts`."""
    num_tokens, top_k = topk_ids.shape
    num_experts, double_inter, hidden = w13.shape
    inter, num_pairs = double_inter // 2, num_tokens * top_k
    if x.stride(1) != 1:
        x = x.contiguous()
    w13, w2 = w13.contiguous(), w2.contiguous()
    block_m = 16 if num_pairs <= 8 * num_experts else 64
    block_n, block_k = 64, 32
    precision = (
        "ieee" if x.dtype == torch.float32 else "tf32"
    )  # fp32 models get fp32 products, not tf32
    dot_fp32 = _dot_in_fp32(x.dtype)
    rows, block_experts = align_by_expert(topk_ids, num_experts, block_m)
    num_blocks = rows.numel() // block_m
    h = torch.empty(rows.numel(), inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x,
        x.stride(0),
        w13,
        rows,
        block_experts,
        h,
        num_pairs,
        top_k,
        num_experts,
        hidden,
        inter,
        ACTIVATION=_ACTIVATION_IDS[activation],
        PRECISION=precision,
        DOT_FP32=dot_fp32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    y = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)
    weights = topk_weights.flatten().to(torch.float32).contiguous()
    _down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        h,
        w2,
        rows,
        block_experts,
        weights,
        y,
        num_pairs,
        num_experts,
        hidden,
        inter,
        PRECISION=precision,
        DOT_FP32=dot_fp32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return y.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
