"""Pure-torch paged attention and KV store: the CPU path and the reference the Triton kernels are tested against.

Cache layout (one tensor per layer for K and one for V): ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A step's tokens are flattened: request ``r`` owns query rows ``query_start_loc[r]:query_start_loc[r+1]``;
its cache holds ``context_lens[r]`` tokens *including* this step's new ones (they are stored first), so
query row ``i`` of a request with ``q_len`` new tokens sits at position ``context_lens[r] - q_len + i``
and attends causally to every cached position up to and including its own. With a ``sliding_window``
of ``w`` it sees only the last ``w`` of those (positions ``> p - w``, as in HF's sliding-window mask), and
``softcap`` ``c`` replaces each scaled score ``s`` by ``c * tanh(s / c)`` before the softmax (Gemma 2).
``visible_ends`` (Gemma 3's images, whose tokens see their whole image) gives each query row the position
before which it sees keys instead of its own position plus one; the window still counts back from its own.
"""

import torch
import torch.nn.functional as F


def cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[int, ...]:
    """The shape of one layer's K (or V) cache in this layout (the Triton kernels share it)."""
    return (num_blocks, block_size, num_kv_heads, head_dim)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's key and value rows into the cache slot ``slot_mapping[t]``; slot -1 means skip."""
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(
        0, slot_mapping, value.to(v_cache.dtype)
    )


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_context_len: int,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    visible_ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new query tokens over its paged context.

    Args:
        query: ``[num_tokens, num_heads, head_dim]``, the step's flattened query rows.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_reqs, max_blocks]`` int32; entries past a request's context are ignored.
        context_lens: ``[num_reqs]`` int32, cached tokens per request after this step's store.
        query_start_loc: ``[num_reqs + 1]`` int32, cumulative new-token counts.
        max_query_len, max_context_len: host-side maxima of the two lengths (no device sync needed).
        scale: softmax scale, usually ``head_dim ** -0.5``.
        sliding_window: when set, each row attends only its last ``sliding_window`` positions.
        softcap: when set, scores are soft-capped at ``+-softcap`` (after scaling, before the mask).
        visible_ends: when set, ``[num_tokens]`` int32: each row sees the keys before this
            position (at most its context's length) rather than up to its own.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in the query's dtype.
    """
    single = lambda q, table, length, ends=None: _request_attention(
        q, k_cache, v_cache, table, length, scale, sliding_window, softcap, ends
    )
    if visible_ends is not None:
        return attend_each_request(
            query, block_tables, context_lens, query_start_loc, visible_ends, single
        )
    return attend_by_request_kind(
        query,
        block_tables,
        context_lens,
        query_start_loc,
        max_query_len,
        max_context_len,
        decode=lambda q, tables, lens, longest: _decode_attention(
            q, k_cache, v_cache, tables, lens, longest, scale, sliding_window, softcap
        ),
        single=single,
    )


def attend_each_request(
    query, block_tables, context_lens, query_start_loc, visible_ends, single
) -> torch.Tensor:
    """A step whose rows see up to ``visible_ends``: each request attended alone by
    ``single(query_rows, block_table, context_len, row_ends)`` (steps that carry Gemma 3's
    images, run eagerly; shared by the torch reference and the CPU fast path)."""
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for r, length in enumerate(context_lens.tolist()):
        rows = slice(starts[r], starts[r + 1])
        out[rows] = single(query[rows], block_tables[r], length, visible_ends[rows])
    return out


def attend_by_request_kind(
    query,
    block_tables,
    context_lens,
    query_start_loc,
    max_query_len: int,
    max_context_len: int,
    decode,
    single,
) -> torch.Tensor:
    """Route a step's requests: one-token requests (decodes) together, the others one by one.

    ``decode(query_rows, block_tables, context_lens, max_context_len)`` attends a padded batch of
    single-token requests; ``single(query_rows, block_table, context_len)`` attends one request
    with several new tokens. Shared by the torch reference and the CPU fast path.
    """
    if max_query_len == 1:
        return decode(query, block_tables, context_lens, max_context_len)
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    num_reqs = block_tables.shape[0]
    decodes = [r for r in range(num_reqs) if starts[r + 1] - starts[r] == 1]
    if decodes:
        rows = torch.tensor([starts[r] for r in decodes], device=query.device)
        picked = torch.tensor(decodes, device=query.device)
        out[rows] = decode(
            query[rows], block_tables[picked], context_lens[picked], max(lens[r] for r in decodes)
        )
    for r in range(num_reqs):
        if starts[r + 1] - starts[r] > 1:
            out[starts[r] : starts[r + 1]] = single(
                query[starts[r] : starts[r + 1]], block_tables[r], lens[r]
            )
    return out


def _gather(cache: torch.Tensor, block_table: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """``[..., num_blocks * block_size, num_kv_heads, head_dim]`` view of the blocks a table names."""
    blocks = cache[block_table[..., :num_blocks].long()]
    return blocks.flatten(-4, -3)


def _request_attention(
    q, k_cache, v_cache, block_table, context_len: int, scale: float, window, softcap, ends=None
):
    block_size = k_cache.shape[1]
    num_blocks = -(-context_len // block_size)
    k = _gather(k_cache, block_table, num_blocks)[:context_len].transpose(0, 1)
    v = _gather(v_cache, block_table, num_blocks)[:context_len].transpose(0, 1)
    return attend_rows(q, k, v, scale, window, softcap, ends)


def visible_mask(
    q_len: int, context_len: int, window: int | None, device, ends: torch.Tensor | None = None
) -> torch.Tensor:
    """``[q_len, context_len]`` bool: which positions each of the context's last ``q_len`` rows
    sees (up to its own position, or before its ``ends`` entry)."""
    # Row i sits at position context_len - q_len + i (bottom-right aligned causal mask).
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (context_len - q_len)
    cols = torch.arange(context_len, device=device).unsqueeze(0)
    mask = cols <= rows if ends is None else cols < ends.to(device).unsqueeze(1)
    return mask if window is None else mask & (cols > rows - window)


def soft_cap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(scores / softcap)``, or ``scores`` unchanged when ``softcap`` is None."""
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def attend_rows(
    q, k, v, scale: float, window: int | None, softcap: float | None, ends=None
) -> torch.Tensor:
    """q ``[q_len, heads, dim]`` (the context's last rows) over k/v ``[kv_heads, context, dim]``
    (``ends``: see `visible_mask`).

    Shared by the torch reference and the CPU fallback: SDPA where it applies (its ``is_causal`` when
    the rows are the whole context), explicit float32 scores where soft-capping needs them.
    """
    q_len, context_len = q.shape[0], k.shape[1]
    k, v = k.to(q.dtype), v.to(q.dtype)
    plain_causal = softcap is None and q_len == context_len and window is None and ends is None
    mask = None if plain_causal else visible_mask(q_len, context_len, window, q.device, ends)
    if softcap is None:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=mask,
            is_causal=plain_causal and q_len > 1,
            scale=scale,
            enable_gqa=True,
        )
        return out.squeeze(0).transpose(0, 1)
    num_heads, num_kv_heads, dim = q.shape[1], k.shape[0], q.shape[2]
    group = num_heads // num_kv_heads
    grouped = q.transpose(0, 1).reshape(num_kv_heads, group * q_len, dim)
    scores = soft_cap(torch.matmul(grouped, k.transpose(-1, -2)).float() * scale, softcap)
    scores = scores.view(num_kv_heads, group, q_len, context_len)
    scores.masked_fill_(~mask, float("-inf"))
    out = torch.matmul(
        scores.softmax(dim=-1).to(q.dtype).view(num_kv_heads, group * q_len, context_len), v
    )
    return out.view(num_heads, q_len, dim).transpose(0, 1)


def _decode_attention(
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
    """One new token per request: gather every context into one padded batch and attend with two matmuls.

    Query heads are grouped by the KV head they share, so K and V are never repeated; scores
    and softmax run in float32 (plain matmuls beat SDPA's CPU kernel here, several times over in bf16).
    """
    num_reqs, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    num_blocks = -(-max_context_len // k_cache.shape[1])
    k = _gather(k_cache, block_tables, num_blocks).transpose(1, 2).to(query.dtype)
    v = _gather(v_cache, block_tables, num_blocks).transpose(1, 2).to(query.dtype)
    q = query.view(num_reqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = soft_cap(torch.matmul(q, k.transpose(-1, -2)).float() * scale, softcap)
    hidden = decode_hidden(k.shape[2], context_lens, window)
    scores.masked_fill_(hidden.view(num_reqs, 1, 1, -1), float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1).to(query.dtype), v)
    return out.view(num_reqs, num_heads, head_dim)


def decode_hidden(length: int, context_lens: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[num_reqs, length]`` bool: the padded positions a decode row must not see (past its context, or
    out of its window)."""
    positions = torch.arange(length, device=context_lens.device)
    hidden = positions >= context_lens.unsqueeze(1)
    if window is not None:
        hidden |= positions <= (context_lens - 1 - window).unsqueeze(1)
    return hidden
