"""Reference for the grouped expert MLPs of a mixture-of-experts layer: one matmul chain per active expert.

The contract every MoE kernel (`cpu_moe`, `triton_moe`) is tested against. Expert weights are stacked:
``w13 [experts, 2 * inter, hidden]`` holds each expert's gate rows then its up rows, ``w2 [experts,
hidden, inter]`` its down projection. ``topk_weights`` and ``topk_ids`` (``[tokens, top_k]``) are the
router's choice. Experts that received no token cost nothing, except inside a CUDA-graph capture,
where the routing cannot be read on the host: there every expert runs over every token and the
routing weights (zero for experts not chosen) mix them (`dense_experts`).
"""

import torch
import torch.nn.functional as F

from spyglass.kernels import torch_norm_rope

ACTIVATIONS = ("silu", "gelu_tanh")


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted_pairs, counts)``: the flattened (token, k) pair indices ordered by expert (stable, one
    argsort), and how many pairs each expert received (``[num_experts]``)."""
    ids = topk_ids.flatten()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(
        0, ids, torch.ones_like(ids)
    )
    return ids.argsort(stable=True), counts


def fused_experts(x, w13, w2, topk_weights, topk_ids, activation: str = "silu") -> torch.Tensor:
    """``out [tokens, hidden]`` in x's dtype: ``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])``,
    each expert being ``down(act(gate x) * up x)`` with ``act`` SiLU or tanh-GELU."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return dense_experts(x, w13, w2, topk_weights, topk_ids, activation)
    top_k = topk_ids.shape[1]
    and_mul = (
        torch_norm_rope.silu_and_mul if activation == "silu" else torch_norm_rope.gelu_tanh_and_mul
    )
    sorted_pairs, counts = sort_by_expert(topk_ids, w13.shape[0])
    weights = topk_weights.flatten().to(x.dtype)
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count:
            pairs = sorted_pairs[start : start + count]
            tokens = pairs // top_k
            y = F.linear(and_mul(F.linear(x[tokens], w13[expert])), w2[expert])
            out.index_add_(0, tokens, y * weights[pairs, None])
            start += count
    return out


def dense_experts(x, w13, w2, topk_weights, topk_ids, activation: str = "silu") -> torch.Tensor:
    """`fused_experts` without reading the routing on the host (CUDA-graph safe): every expert over every token."""
    and_mul = (
        torch_norm_rope.silu_and_mul if activation == "silu" else torch_norm_rope.gelu_tanh_and_mul
    )
    gates = torch.zeros(x.shape[0], w13.shape[0], dtype=x.dtype, device=x.device)
    gates.scatter_(1, topk_ids, topk_weights.to(x.dtype))
    out = torch.zeros_like(x)
    for expert in range(w13.shape[0]):
        out += (
            F.linear(and_mul(F.linear(x, w13[expert])), w2[expert]) * gates[:, expert : expert + 1]
        )
    return out
