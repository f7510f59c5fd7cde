"""The CPU fast path: paged attention and KV store over a head-major cache layout.

Same arguments and results as `torch_attention` (the reference), but each layer's cache is
``[num_kv_heads, num_blocks, block_size, head_dim]``: a block holds one head's keys contiguously,
which is what the compiled kernel (native/paged_attention.cpp) streams. The pure-torch fallback,
for machines where the kernel does not build, gathers blocks along dim 1 into
``[num_kv_heads, tokens, head_dim]``, the layout its matmuls read.
"""

import torch

from spyglass.kernels import cpu_native, torch_attention


def cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[int, ...]:
    """The shape of one layer's K (or V) cache in this layout."""
    return (num_kv_heads, num_blocks, block_size, head_dim)


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Write each token's key and value into slot ``slot_mapping[t]``; slot -1 means skip."""
    native = (
        key.dtype == value.dtype
        and cpu_native.attends(key.dtype, k_cache.dtype)
        and _rows_of_contiguous_heads(key)
        and _rows_of_contiguous_heads(value)
        and (key.shape[0] == 1 or key.stride(0) == value.stride(0))
    )
    if native:
        cpu_native.store_kv(key, value, k_cache, v_cache, slot_mapping)
        return
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    num_kv_heads, head_dim = k_cache.shape[0], k_cache.shape[3]
    k_cache.view(num_kv_heads, -1, head_dim).index_copy_(
        1, slot_mapping, key.transpose(0, 1).to(k_cache.dtype)
    )
    v_cache.view(num_kv_heads, -1, head_dim).index_copy_(
        1, slot_mapping, value.transpose(0, 1).to(v_cache.dtype)
    )


def _rows_of_contiguous_heads(x: torch.Tensor) -> bool:
    """Whether each token's ``[heads, dim]`` block of ``x`` is contiguous (size-1 dims may have any stride)."""
    return (x.shape[2] == 1 or x.stride(2) == 1) and (x.shape[1] == 1 or x.stride(1) == x.shape[2])


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``[num_kv_heads, len(block_ids) * block_size, head_dim]``: the named blocks, in order."""
    block_ids = block_ids.long()
    num_kv_heads, _, block_size, head_dim = cache.shape
    out = torch.empty(
        num_kv_heads,
        block_ids.numel(),
        block_size,
        head_dim,
        dtype=cache.dtype,
        device=cache.device,
    )
    # One dim-0 gather per head takes torch's memcpy path; a dim-1 gather is element-wise and 2-3x slower.
    for head in range(num_kv_heads):
        torch.index_select(cache[head], 0, block_ids, out=out[head])
    return out.view(num_kv_heads, -1, head_dim)


def paged_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    query_start_loc,
    max_query_len: int,
    max_context_len: int,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    visible_ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its paged context (see `torch_attention`).

    The compiled kernel reads K and V straight from the cache for every request in one call; where
    it did not build, decodes are gathered into one padded batch and other requests go through SDPA.
    A step with ``visible_ends`` (one that computes Gemma 3's image tokens) attends each request's
    gathered context through SDPA with that mask.
    """
    single = lambda q, table, length, ends=None: _request(
        q, k_cache, v_cache, table, length, scale, sliding_window, softcap, ends
    )
    if visible_ends is not None:
        return torch_attention.attend_each_request(
            query, block_tables, context_lens, query_start_loc, visible_ends, single
        )
    if cpu_native.attends(query.dtype, k_cache.dtype):
        return cpu_native.paged_attention(
            query,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            query_start_loc,
            scale,
            sliding_window,
            softcap,
        )
    return torch_attention.attend_by_request_kind(
        query,
        block_tables,
        context_lens,
        query_start_loc,
        max_query_len,
        max_context_len,
        decode=lambda q, tables, lens, longest: _decode(
            q, k_cache, v_cache, tables, lens, longest, scale, sliding_window, softcap
        ),
        single=single,
    )


def _request(
    q, k_cache, v_cache, block_table, context_len: int, scale: float, window, softcap, ends=None
) -> torch.Tensor:
    """One request's several new tokens over its gathered context."""
    num_blocks = -(-context_len // k_cache.shape[2])
    k = _gather(k_cache, block_table[:num_blocks])[:, :context_len]
    v = _gather(v_cache, block_table[:num_blocks])[:, :context_len]
    return torch_attention.attend_rows(q, k, v, scale, window, softcap, ends)


def _decode(
    query,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    max_context_len: int,
    scale: float,
    window,
    softcap,
):
    """One new token per request: all contexts gathered into one padded batch, two batched matmuls.

    Query heads are grouped by the KV head they share (K and V are never repeated); scores and
    softmax run in float32. Plain matmuls beat SDPA's CPU kernel here, several times over in bf16.
    """
    num_reqs, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[0], k_cache.shape[2]
    num_blocks = -(-max_context_len // block_size)
    length = num_blocks * block_size
    block_ids = block_tables[:, :num_blocks].reshape(-1)
    k = _gather(k_cache, block_ids).view(num_kv_heads, num_reqs, length, head_dim).to(query.dtype)
    v = _gather(v_cache, block_ids).view(num_kv_heads, num_reqs, length, head_dim).to(query.dtype)
    q = query.view(num_reqs, num_kv_heads, num_heads // num_kv_heads, head_dim).transpose(0, 1)
    scores = torch_attention.soft_cap(torch.matmul(q, k.transpose(-1, -2)).float() * scale, softcap)
    hidden = torch_attention.decode_hidden(length, context_lens, window)
    scores.masked_fill_(hidden.view(1, num_reqs, 1, length), float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1).to(query.dtype), v)
    return out.transpose(0, 1).reshape(num_reqs, num_heads, head_dim)
