"""What attention needs to know about a step's flattened batch."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Per-step tensors for storing KV and attending over the paged cache (see kernels/torch_attention.py)."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_context_len: int
    visible_ends: torch.Tensor | None = None
    """Where some rows see past themselves (Gemma 3's image tokens see their whole image): each
    row's ``[num_tokens]`` position before which it sees keys; None when every row is causal."""
