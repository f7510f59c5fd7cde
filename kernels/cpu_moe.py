"""The CPU backend's grouped expert MLPs: the compiled kernel (native/moe.cpp) where it applies, else the reference.

Same contract as `torch_moe.fused_experts`. The pairs are sorted by expert here, once, with torch;
the kernel then runs every expert's gate/up and down projections as parallel (expert, column tile)
work items. The native path needs x and the stacked weights in one dtype (float32 or bfloat16),
contiguous weights and unit-stride rows; anything else takes the reference path.
"""

import torch

from spyglass.kernels import cpu_native, torch_moe


def fused_experts(x, w13, w2, topk_weights, topk_ids, activation: str = "silu") -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])``; see `torch_moe.fused_experts`."""
    native = (
        cpu_native.available(x.dtype)
        and w13.dtype == w2.dtype == x.dtype
        and x.stride(-1) == 1
        and w13.is_contiguous()
        and w2.is_contiguous()
        and activation in torch_moe.ACTIVATIONS
    )
    if not native:
        return torch_moe.fused_experts(x, w13, w2, topk_weights, topk_ids, activation)
    sorted_pairs, counts = torch_moe.sort_by_expert(topk_ids, w13.shape[0])
    return cpu_native.fused_experts(
        x, w13, w2, sorted_pairs, counts, topk_weights, topk_ids.shape[1], activation
    )
