"""Triton paged attention: the CUDA twin of `torch_attention.paged_attention`, same signature and semantics.

Two kernels share the work. `unified_attention` handles any mix of prefill chunks, drafts and decode: one
program per (tile of one request's query tokens, KV head), whose rows are every (token, query head) pair of
the tile that shares that KV head, so each cached page is read once per group. Each request has as many
tiles as the longest one, or, where a few long prompts share a step with many decodes, the tiles are
packed by where each request's queries start (`query_tile_grid`). `split_k_decode_attention`
(flash-decoding) serves decode-only steps with few requests and long contexts, where the unified grid would
leave most SMs idle: each request's context is cut into partitions attended in parallel, and the last
partition of each (request, KV head) to finish merges the partial results by their log-sum-exp.
`paged_attention` picks between them with `num_kv_splits`.
Both read the context in tiles of several pages, and honour the optional sliding window (tiles wholly
before every row's window are skipped) and Gemma 2's score soft-capping.
"""

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from spyglass.kernels import torch_attention

# Rows per program are (query tokens x grouped heads); tl.dot needs at least 16 of them.
_MIN_ROWS = 16
_MAX_ROWS = 64
# A split-K partition shorter than this (two tiles at head_dim 128) costs more in the reduce than it
# wins in parallelism.
_MIN_TOKENS_PER_SPLIT = 128
# Bytes of each K (and V) tile of the inner loop: 64 positions of 128 dims at 16 bits, so a program
# has 16 KiB of keys and 16 KiB of values in flight per iteration (a 16-position page alone would be
# 4 KiB), and the tiles of a few pipeline stages fit in shared memory whatever the cache's dtype.
_KV_TILE_BYTES = 16 * 1024
_MAX_KV_TILE = 128
MAX_SPLITS = 64
# Split-K runs when its (request, KV head) programs do not fill the GPU (`num_kv_splits`), so a few
# hundred counters suffice; these cover any direct call of up to 64Ki pairs.
_MAX_MERGE_COUNTERS = 1 << 16
# The merge reads (head, partition) rows of partial outputs in chunks of at most this many rows.
_MERGE_CHUNK_ROWS = 64


@dataclass(frozen=True, slots=True)
class Tiling:
    """How an attention kernel is launched: context positions per inner-loop tile (None: as many as
    make ``tile_bytes`` of keys, `_kv_tile`), and Triton's warps per program and software-pipeline
    stages; whether the unified kernel may pack its query tiles (`query_tile_grid`).
    `examples/gpu_check.py` sweeps these on a GPU."""

    kv_tile: int | None = None
    num_warps: int = 4
    num_stages: int = 3
    tile_bytes: int = _KV_TILE_BYTES
    pack_query_tiles: bool = True

    def __post_init__(self):
        if self.kv_tile is not None and (
            self.kv_tile & (self.kv_tile - 1) or not _MIN_ROWS <= self.kv_tile <= _MAX_KV_TILE
        ):
            raise ValueError(f"kv_tile must be a power of two in {_MIN_ROWS}..{_MAX_KV_TILE}")

    def tile(self, dim_pad: int, element_size: int) -> int:
        """Positions per tile for heads padded to ``dim_pad`` in a cache of ``element_size`` bytes."""
        return self.kv_tile or _kv_tile(dim_pad, element_size, self.tile_bytes)


DEFAULT_TILING = Tiling()
# Split-K runs when few requests decode: each program's partition is a few tiles, so fewer, larger
# tiles in two stages keep more bytes in flight. On the H200 (bf16, head_dim 128: 128 positions)
# this took batch 1 at 32k from 67% to 79% of copy bandwidth and batch 8 at 8k from 89% to 94%;
# the unified kernel's larger batches were best with the default.
SPLIT_K_TILING = Tiling(num_stages=2, tile_bytes=2 * _KV_TILE_BYTES)


@triton.jit
def _attend_tile(
    q,
    acc,
    m_i,
    l_i,
    k_cache_ptr,
    v_cache_ptr,
    table,
    tile_start,
    kv_limit,
    q_pos,
    kv_head,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_cd,
    head_dim,
    qk_scale,
    softcap,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DIM_PAD: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Fold ``TILE_N`` context positions from ``tile_start`` into the online-softmax state (``acc``,
    running max ``m_i``, sum ``l_i``).

    A tile spans several cache pages (each position finds its block through ``table``), so a program
    has a whole tile's loads in flight instead of one page's. Positions at or past ``kv_limit`` are
    neither loaded (they may hold garbage, and their table entries may not exist) nor attended; row
    ``r`` attends position ``p`` only when ``p <= q_pos[r]`` and, with a ``WINDOW`` > 0,
    ``p > q_pos[r] - WINDOW``. Scores are in the log2 domain (``qk_scale`` already includes log2(e))
    so the exponentials are exp2; with ``SOFTCAP`` the natural-log score ``s`` becomes
    ``softcap * tanh(s / softcap)`` first.
    """
    kv_pos = tile_start + tl.arange(0, TILE_N)
    dims = tl.arange(0, DIM_PAD)
    in_context = kv_pos < kv_limit
    block_ids = tl.load(table + kv_pos // BLOCK_SIZE, mask=in_context, other=0)
    load_mask = in_context[:, None] & (dims[None, :] < head_dim)
    off = block_ids.to(tl.int64)[:, None] * stride_cb + (kv_pos % BLOCK_SIZE)[:, None] * stride_cs
    off += kv_head * stride_ch + dims[None, :] * stride_cd
    k = tl.load(k_cache_ptr + off, mask=load_mask, other=0.0).to(q.dtype)
    v = tl.load(v_cache_ptr + off, mask=load_mask, other=0.0).to(q.dtype)
    # ieee keeps fp32 inputs out of TF32; it does not affect 16-bit inputs.
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    if SOFTCAP:
        # tanh(x) = 1 - 2 / (exp(2x) + 1), exact at both infinities; scores go to nats and back.
        x = s * (0.6931471805599453 / softcap)
        s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)) * 1.4426950408889634
    visible = (kv_pos[None, :] <= q_pos[:, None]) & in_context[None, :]
    if WINDOW > 0:
        visible = visible & (kv_pos[None, :] > q_pos[:, None] - WINDOW)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row may see nothing in a tile yet (a window starting later, a split before it): measuring from 0
    # then keeps exp2(-inf - m) a clean 0 instead of NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return acc, m_new, l_i


# The block table's row stride is the longest table of the step, so it changes from step to step;
# Triton would compile a variant whenever it became 1 or a multiple of 16 (a recompilation while
# serving, after capture). Values that vary at run time are therefore not specialised on.
_VARYING = ("stride_bt",)
# So are the unified kernel's request count and tiles per request (0 when the tiles are packed).
_VARYING_TILES = _VARYING + ("num_reqs", "tiles_per_req")


@triton.jit
def _request_of_tile(query_start_loc_ptr, tile_index, num_reqs, BLOCK_Q: tl.constexpr):
    """The request whose packed query tiles hold tile ``tile_index``: request ``i``'s first tile is
    ``query_start_loc[i] // BLOCK_Q + i`` (one more than the tiles before it can fill, so a request
    never shares a tile), which grows with ``i``; a binary search for the last one at or before it."""
    low = num_reqs * 0
    high = num_reqs
    while high - low > 1:
        mid = (low + high) // 2
        at_or_before = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile_index
        low = tl.where(at_or_before, mid, low)
        high = tl.where(at_or_before, high, mid)
    return low


@triton.jit(do_not_specialize=_VARYING_TILES)
def _unified_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_cd,
    stride_bt,
    head_dim,
    qk_scale,
    softcap,
    num_reqs,
    tiles_per_req,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DIM_PAD: tl.constexpr,
    DOT_FP32: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One program: a tile of ``BLOCK_Q`` query tokens of one request x the ``GROUP`` heads of one KV
    head. Program ``p`` of the first grid axis is tile ``p % tiles_per_req`` of request
    ``p // tiles_per_req``, or with ``tiles_per_req`` 0 the packed tile ``p`` (`_request_of_tile`)."""
    program = tl.program_id(0)
    kv_head = tl.program_id(1)
    if tiles_per_req > 0:
        req = program // tiles_per_req
        tile = program % tiles_per_req
        q_start = tl.load(query_start_loc_ptr + req)
    else:
        req = _request_of_tile(query_start_loc_ptr, program, num_reqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + req)
        tile = program - (q_start // BLOCK_Q + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    # A request shorter than the grid allows has nothing to do in its trailing tiles.
    if tile * BLOCK_Q >= q_len:
        return
    context_len = tl.load(context_lens_ptr + req)

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    q_idx = tile * BLOCK_Q + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_mask = (q_idx < q_len) & (rows % GROUP_PAD < GROUP)
    dims = tl.arange(0, DIM_PAD)
    io_mask = row_mask[:, None] & (dims[None, :] < head_dim)
    token = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=io_mask,
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)
    # Bottom-right aligned causal mask: the new tokens are the last q_len of the context.
    q_pos = context_len - q_len + q_idx
    # The tile's last valid row bounds how much of the context any row needs.
    kv_limit = context_len - q_len + tl.minimum((tile + 1) * BLOCK_Q, q_len)

    acc = tl.zeros([BLOCK_Q * GROUP_PAD, DIM_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    table = block_tables_ptr + req.to(tl.int64) * stride_bt
    # The tile's first row has the earliest window: positions before it are hidden from every row.
    first_pos = 0
    if WINDOW > 0:
        first_pos = (
            tl.maximum(context_len - q_len + tile * BLOCK_Q - WINDOW + 1, 0) // TILE_N * TILE_N
        )
    for tile_start in range(first_pos, kv_limit, TILE_N):
        acc, m_i, l_i = _attend_tile(
            q,
            acc,
            m_i,
            l_i,
            k_cache_ptr,
            v_cache_ptr,
            table,
            tile_start,
            kv_limit,
            q_pos,
            kv_head,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_cd,
            head_dim,
            qk_scale,
            softcap,
            BLOCK_SIZE,
            TILE_N,
            DIM_PAD,
            WINDOW,
            SOFTCAP,
        )
    out = acc / l_i[:, None]
    tl.store(
        out_ptr
        + token[:, None] * stride_ot
        + head[:, None] * stride_oh
        + dims[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


@triton.jit(do_not_specialize=_VARYING)
def _split_k_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    part_out_ptr,
    part_lse_ptr,
    counters_ptr,
    out_ptr,
    block_tables_ptr,
    context_lens_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_cd,
    stride_bt,
    head_dim,
    qk_scale,
    softcap,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DIM_PAD: tl.constexpr,
    DOT_FP32: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One program: one partition of one decode request's context x the ``GROUP`` heads of one KV head.

    Writes the partition's normalised output and its log2-sum-exp2 per head (an empty partition, in a
    short context, writes lse = -inf: zero weight), then counts itself done on the (request, KV head)'s
    counter; the last of its partitions to finish merges them all into ``out`` (`_merge_partitions`)
    and sets the counter back to 0 for the next call. One launch instead of a second kernel for the
    merge: at small batches the whole step is a few microseconds, and a launch is one of them.
    """
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(
        2
    )  # from the grid, not a compile-time constant: one kernel for any split
    context_len = tl.load(context_lens_ptr + req)
    # Only the tiles holding the token's window (all of them without one) are split.
    window_start = 0
    if WINDOW > 0:
        window_start = tl.maximum(context_len - WINDOW, 0) // TILE_N * TILE_N
    num_tiles = tl.cdiv(context_len - window_start, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    first_pos = window_start + split * tiles_per_split * TILE_N
    last_pos = tl.minimum(first_pos + tiles_per_split * TILE_N, context_len)

    rows = tl.arange(0, ROWS)
    head = kv_head * GROUP + rows
    dims = tl.arange(0, DIM_PAD)
    io_mask = (rows[:, None] < GROUP) & (dims[None, :] < head_dim)
    q = tl.load(
        q_ptr
        + req.to(tl.int64) * stride_qt
        + head[:, None] * stride_qh
        + dims[None, :] * stride_qd,
        mask=io_mask,
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)
    # Decode: the single new token is the context's last position and sees all of it.
    q_pos = tl.full([ROWS], 0, dtype=tl.int32) + context_len - 1

    acc = tl.zeros([ROWS, DIM_PAD], dtype=tl.float32)
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    table = block_tables_ptr + req.to(tl.int64) * stride_bt
    for tile_start in range(first_pos, last_pos, TILE_N):
        acc, m_i, l_i = _attend_tile(
            q,
            acc,
            m_i,
            l_i,
            k_cache_ptr,
            v_cache_ptr,
            table,
            tile_start,
            context_len,
            q_pos,
            kv_head,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_cd,
            head_dim,
            qk_scale,
            softcap,
            BLOCK_SIZE,
            TILE_N,
            DIM_PAD,
            WINDOW,
            SOFTCAP,
        )
    nonempty = l_i > 0
    out = tl.where(nonempty[:, None], acc / tl.where(nonempty, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    # Partials are [num_reqs, num_heads, num_splits(, DIM_PAD)], contiguous.
    slot = (req.to(tl.int64) * (tl.num_programs(1) * GROUP) + head) * num_splits + split
    tl.store(part_out_ptr + slot[:, None] * DIM_PAD + dims[None, :], out, mask=io_mask)
    tl.store(part_lse_ptr + slot, lse, mask=rows < GROUP)
    # Every thread's stores come before the count (the barrier), and the count releases them to
    # the program that will read them (acq_rel, device-wide).
    tl.debug_barrier()
    counter = counters_ptr + req * tl.num_programs(1) + kv_head
    done_before = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if done_before == num_splits - 1:
        tl.debug_barrier()
        tl.store(counter, 0)
        first_head = req.to(tl.int64) * (tl.num_programs(1) * GROUP) + kv_head * GROUP
        _merge_partitions(
            part_out_ptr,
            part_lse_ptr,
            out_ptr + req.to(tl.int64) * stride_ot,
            first_head,
            kv_head * GROUP,
            stride_oh,
            stride_od,
            head_dim,
            num_splits,
            GROUP,
            GROUP_PAD,
            SPLITS_PAD,
            SPLIT_CHUNK,
            DIM_PAD,
        )


@triton.jit
def _merge_partitions(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    first_head,
    first_out_head,
    stride_oh,
    stride_od,
    head_dim,
    num_splits,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    """Merge ``num_splits`` partial outputs of ``GROUP`` heads (partials from ``first_head``) into
    ``out_ptr``'s heads from ``first_out_head``: each partition weighted by exp2(lse - max lse).

    The partials were written by other programs, so they are read from L2 (``.cg``), in chunks of
    ``SPLIT_CHUNK`` partitions x every head at once: a chunk's loads are all in flight together.
    ``SPLITS_PAD`` covers the most partitions there can be, so one compiled kernel serves any count.
    """
    heads = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    head_ok = heads < GROUP
    lse_base = (first_head + heads) * num_splits
    splits = tl.arange(0, SPLITS_PAD)
    lse = tl.load(
        part_lse_ptr + lse_base[:, None] + splits[None, :],
        mask=head_ok[:, None] & (splits[None, :] < num_splits),
        other=float("-inf"),
        cache_modifier=".cg",
    )
    # Partition 0 is never empty (it holds the window's start, or position 0), so the max is finite
    # for every real head; padding heads measure from 0.
    top = tl.max(lse, axis=1)
    top = tl.where(head_ok, top, 0.0)
    total = tl.sum(tl.exp2(lse - top[:, None]), axis=1)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    chunk = tl.arange(0, SPLIT_CHUNK)
    for first_split in range(0, num_splits, SPLIT_CHUNK):
        split = first_split + chunk
        in_chunk = head_ok[:, None] & (split[None, :] < num_splits)
        slot = lse_base[:, None] + split[None, :]
        weight = tl.exp2(
            tl.load(part_lse_ptr + slot, mask=in_chunk, other=float("-inf"), cache_modifier=".cg")
            - top[:, None]
        )
        part = tl.load(
            part_out_ptr + slot[:, :, None] * DIM_PAD + dims[None, None, :],
            mask=in_chunk[:, :, None] & (dims[None, None, :] < head_dim),
            other=0.0,
            cache_modifier=".cg",
        )
        acc += tl.sum(part * weight[:, :, None], axis=1)
    out = acc / tl.where(head_ok, total, 1.0)[:, None]
    tl.store(
        out_ptr + (first_out_head + heads)[:, None] * stride_oh + dims[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & (dims[None, :] < head_dim),
    )


def warm_up_shapes() -> tuple[tuple[int, ...], int]:
    """Steps that between them use every compiled variant of these kernels: prefills of these query
    lengths (one per tile height the attention kernel can take: the height follows the step's
    longest query up to ``_MAX_ROWS``) and one decode over a context this long (split-K)."""
    heights = tuple(2**i for i in range(_MAX_ROWS.bit_length()))
    return heights, 2 * _MIN_TOKENS_PER_SPLIT


@functools.cache
def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on ``device``; the interpreter (CPU) is treated as one small GPU."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def num_kv_splits(
    num_reqs: int,
    num_kv_heads: int,
    num_tokens: int,
    max_query_len: int,
    max_context_len: int,
    num_sms: int,
) -> int:
    """How many partitions split-K decode should cut each context into; 1 means use the unified kernel.

    Split only decode-only steps whose (request, KV head) programs cannot fill the GPU by themselves,
    aiming at about two programs per SM while keeping each partition at least
    ``_MIN_TOKENS_PER_SPLIT`` tokens long.
    """
    programs = num_reqs * num_kv_heads
    if max_query_len != 1 or num_tokens != num_reqs or programs >= num_sms:
        return 1
    by_occupancy = triton.cdiv(2 * num_sms, programs)
    by_length = max_context_len // _MIN_TOKENS_PER_SPLIT
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


@functools.cache
def _merge_counters_buffer(device: torch.device) -> torch.Tensor:
    """The device's split-K counters, zeroed once: each call leaves them at 0 again (the merging
    program resets its own). One buffer for the device's lifetime, since a captured CUDA graph keeps
    its address. Calls on one device are ordered by its stream; two split-K calls running at once on
    different streams of one device would share counters. Made outside any CUDA graph capture: one
    made inside would be zeroed only when the graph replays."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "split-K decode ran first on this device inside a CUDA graph capture: run it once "
            "before capturing (as every warm-up does), so that its counters are zeroed"
        )
    return torch.zeros(_MAX_MERGE_COUNTERS, dtype=torch.int32, device=device)


def _merge_counters(device: torch.device, needed: int) -> torch.Tensor:
    """A counter per (request, KV head) of a split-K call."""
    assert needed <= _MAX_MERGE_COUNTERS, f"split-K over {needed} (request, KV head) pairs"
    return _merge_counters_buffer(device)


def _kv_tile(dim_pad: int, element_size: int, tile_bytes: int) -> int:
    """Context positions per inner-loop tile for heads padded to ``dim_pad`` in a cache of
    ``element_size``-byte values: ``tile_bytes``, within tl.dot's 16 rows and 128."""
    return min(_MAX_KV_TILE, max(_MIN_ROWS, tile_bytes // (dim_pad * element_size)))


def _dot_in_fp32(dtype: torch.dtype) -> bool:
    """Whether tl.dot must take fp32 operands: only for bf16 under the interpreter, whose tl.dot multiplies
    bf16 bit patterns as integers. On a GPU the operands stay in the query dtype (tensor cores)."""
    return dtype == torch.bfloat16 and triton.knobs.runtime.interpret


def _head_geometry(query: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int]:
    """(query heads per KV head, head_dim padded to a power of two)."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = k_cache.shape[2]
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    return num_heads // num_kv_heads, triton.next_power_of_2(head_dim)


def query_tile_grid(
    num_reqs: int, num_tokens: int, max_query_len: int, block_q: int, pack: bool = True
) -> tuple[int, int]:
    """(programs per KV head, tiles per request) of the unified kernel: every request with as many
    tiles of ``block_q`` query tokens as the longest, or, where fewer and ``pack`` allows, the tiles
    packed (tiles per request 0: at most ``num_tokens // block_q + num_reqs``, `_request_of_tile`).

    A step of one long prompt chunk among many decodes would otherwise launch the chunk's tile
    count for every request (a 2,000-token chunk among 255 decodes, 16 rows a tile: 125 tiles each,
    32,000 programs per KV head, all but 380 of them returning at once; packed, 396); a decode step
    keeps its one tile per request. From host ints only, so a step's grid never waits for the
    device."""
    tiles_per_req = triton.cdiv(max_query_len, block_q)
    packed = num_tokens // block_q + num_reqs
    if pack and packed < num_reqs * tiles_per_req:
        return packed, 0
    return num_reqs * tiles_per_req, tiles_per_req


def unified_attention(
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
    tiling: Tiling = DEFAULT_TILING,
) -> torch.Tensor:
    """`paged_attention` through the single-pass kernel, whatever the mix of prefill, draft and decode rows.

    ``max_context_len`` is accepted for signature parity only: each program reads its own request's length.
    """
    assert k_cache.stride() == v_cache.stride(), "k_cache and v_cache must share a layout"
    out = torch.empty_like(query)
    num_reqs = block_tables.shape[0]
    if query.shape[0] == 0 or max_query_len == 0:
        return out
    group, dim_pad = _head_geometry(query, k_cache)
    group_pad = triton.next_power_of_2(group)
    # Enough query tokens per tile to feed tl.dot, no more than the longest request can use
    # (beyond the 16-row minimum) and no more than fits comfortably in registers.
    block_q = min(triton.next_power_of_2(max_query_len), max(1, _MAX_ROWS // group_pad))
    block_q = max(block_q, triton.cdiv(_MIN_ROWS, group_pad))
    programs, tiles_per_req = query_tile_grid(
        num_reqs, query.shape[0], max_query_len, block_q, tiling.pack_query_tiles
    )
    _unified_kernel[(programs, k_cache.shape[2])](
        query,
        k_cache,
        v_cache,
        out,
        block_tables,
        context_lens,
        query_start_loc,
        *query.stride(),
        *out.stride(),
        *k_cache.stride(),
        block_tables.stride(0),
        query.shape[2],
        scale * math.log2(math.e),
        softcap or 1.0,
        num_reqs,
        tiles_per_req,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_SIZE=k_cache.shape[1],
        TILE_N=tiling.tile(dim_pad, k_cache.element_size()),
        DIM_PAD=dim_pad,
        DOT_FP32=_dot_in_fp32(query.dtype),
        WINDOW=sliding_window or 0,
        SOFTCAP=softcap is not None,
        num_warps=tiling.num_warps,
        num_stages=tiling.num_stages,
    )
    return out


def split_k_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    sliding_window: int | None = None,
    softcap: float | None = None,
    tiling: Tiling = SPLIT_K_TILING,
) -> torch.Tensor:
    """Decode attention (query row ``r`` is request ``r``'s only new token) with each context cut into
    ``num_splits`` partitions attended in parallel, then merged by log-sum-exp."""
    assert k_cache.stride() == v_cache.stride(), "k_cache and v_cache must share a layout"
    num_reqs, num_heads, head_dim = query.shape
    assert block_tables.shape[0] == num_reqs, (
        "split-K decode needs exactly one query row per request"
    )
    assert 1 <= num_splits <= MAX_SPLITS, f"num_splits must be 1..{MAX_SPLITS}"
    out = torch.empty_like(query)
    if num_reqs == 0:
        return out
    group, dim_pad = _head_geometry(query, k_cache)
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    part_out = torch.empty(
        num_reqs, num_heads, num_splits, dim_pad, dtype=torch.float32, device=query.device
    )
    part_lse = torch.empty(
        num_reqs, num_heads, num_splits, dtype=torch.float32, device=query.device
    )
    group_pad = triton.next_power_of_2(group)
    _split_k_kernel[(num_reqs, num_kv_heads, num_splits)](
        query,
        k_cache,
        v_cache,
        part_out,
        part_lse,
        _merge_counters(query.device, num_reqs * num_kv_heads),
        out,
        block_tables,
        context_lens,
        *query.stride(),
        *out.stride(),
        *k_cache.stride(),
        block_tables.stride(0),
        head_dim,
        scale * math.log2(math.e),
        softcap or 1.0,
        GROUP=group,
        GROUP_PAD=group_pad,
        ROWS=max(_MIN_ROWS, group_pad),
        SPLITS_PAD=triton.next_power_of_2(MAX_SPLITS),
        SPLIT_CHUNK=max(1, _MERGE_CHUNK_ROWS // group_pad),
        BLOCK_SIZE=block_size,
        TILE_N=tiling.tile(dim_pad, k_cache.element_size()),
        DIM_PAD=dim_pad,
        DOT_FP32=_dot_in_fp32(query.dtype),
        WINDOW=sliding_window or 0,
        SOFTCAP=softcap is not None,
        num_warps=tiling.num_warps,
        num_stages=tiling.num_stages,
    )
    return out


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

    Same arguments and result as `torch_attention.paged_attention`. Decode-only steps too small to fill
    the GPU go through split-K (`num_kv_splits` decides, from host-side ints only); everything else
    through the unified kernel. A step with ``visible_ends`` (one that computes Gemma 3's image
    tokens: eager, a prompt's few) goes through the torch reference, which reads this cache layout.
    """
    args = (query, k_cache, v_cache, block_tables, context_lens, query_start_loc)
    args += (max_query_len, max_context_len, scale, sliding_window, softcap)
    if visible_ends is not None:
        return torch_attention.paged_attention(*args, visible_ends)
    num_reqs = block_tables.shape[0]
    # A window bounds how much of a context any decode reads.
    attended_len = min(max_context_len, sliding_window or max_context_len)
    splits = num_kv_splits(
        num_reqs,
        k_cache.shape[2],
        query.shape[0],
        max_query_len,
        attended_len,
        _num_sms(query.device),
    )
    if splits > 1:
        return split_k_decode_attention(
            query,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            scale,
            splits,
            sliding_window,
            softcap,
        )
    return unified_attention(*args)
