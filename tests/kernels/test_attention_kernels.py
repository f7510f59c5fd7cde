"""Triton attention kernels against the pure-torch versions, and the torch versions against a naive loop.

Without CUDA the Triton kernels run under the interpreter, so shapes stay small. `make_batch` and
`reference_attention` are shared with test_attention_gpu.py.
"""

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before triton is first imported: it decides at @triton.jit time.
    os.environ["TRITON_INTERPRET"] = "1"

from spyglass.kernels import backend, torch_attention

try:
    from spyglass.kernels import triton_attention, triton_store_kv
except ImportError:
    triton_attention = triton_store_kv = None

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(triton_attention is None, reason="needs triton")
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}

# (new tokens per request, cached tokens per request after the store); last blocks are mostly partial.
SCENARIOS = {
    "decode": ([1, 1, 1], [17, 40, 5]),
    "mixed": ([7, 1, 12, 1], [7, 33, 45, 16]),
    "drafts": ([3, 4, 4], [20, 9, 37]),
    # One prompt chunk among decodes: the unified kernel packs its query tiles (`query_tile_grid`).
    "skewed": ([1, 1, 37, 1, 1, 1, 1, 1], [9, 30, 37, 17, 5, 40, 2, 64]),
}


class Batch:
    """One step's paged-attention inputs; ``args`` is the argument tuple of `paged_attention`."""

    def __init__(self, query, k_cache, v_cache, block_tables, context_lens, q_lens):
        self.query, self.k_cache, self.v_cache, self.block_tables = (
            query,
            k_cache,
            v_cache,
            block_tables,
        )
        self.context_lens = context_lens
        starts = [0] + torch.tensor(q_lens).cumsum(0).tolist()
        self.query_start_loc = torch.tensor(starts, dtype=torch.int32, device=query.device)
        self.args = (
            query,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            self.query_start_loc,
            max(q_lens),
            int(context_lens.max()),
            query.shape[-1] ** -0.5,
        )


def make_batch(
    q_lens, ctx_lens, *, num_kv_heads, group, head_dim, block_size, dtype, device=DEVICE, seed=0
):
    """Random paged batch: shuffled block ids, NaN in every cache slot no request has written yet.

    The query is a column slice of a fused qkv tensor, as the model produces it, so it is not contiguous.
    """
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-c // block_size) for c in ctx_lens]
    # Two spare blocks that no request owns; table entries past a context may point anywhere valid.
    num_blocks = sum(pages) + 2
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(
        0, num_blocks, (len(ctx_lens), max(pages)), generator=gen, dtype=torch.int32
    )
    cache_shape = (num_blocks * block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(cache_shape, math.nan), torch.full(cache_shape, math.nan)
    used = 0
    for r, (n, c) in enumerate(zip(pages, ctx_lens)):
        tables[r, :n] = order[used : used + n]
        used += n
        positions = torch.arange(c)
        slots = tables[r, positions // block_size].long() * block_size + positions % block_size
        k_cache[slots] = torch.randn(c, num_kv_heads, head_dim, generator=gen)
        v_cache[slots] = torch.randn(c, num_kv_heads, head_dim, generator=gen)
    num_heads = num_kv_heads * group
    qkv = torch.randn(sum(q_lens), num_heads + 2 * num_kv_heads, head_dim, generator=gen)

    def put(t):
        return t.to(dtype=dtype, device=device)

    paged = (num_blocks, block_size, num_kv_heads, head_dim)
    return Batch(
        put(qkv)[:, :num_heads],
        put(k_cache).view(paged),
        put(v_cache).view(paged),
        tables.to(device),
        torch.tensor(ctx_lens, dtype=torch.int32, device=device),
        q_lens,
    )


def reference_attention(batch: Batch, **masking) -> torch.Tensor:
    """`torch_attention.paged_attention` on the batch, with the NaN poison zeroed first.

    The torch decode path gathers whole blocks and masks scores, so a NaN in an unwritten slot would
    still leak through 0 * NaN; the Triton kernels must never load those slots at all.
    """
    q, k, v, *rest = batch.args
    return torch_attention.paged_attention(q, k.nan_to_num(), v.nan_to_num(), *rest, **masking)


def naive_attention(
    batch: Batch,
    sliding_window: int | None = None,
    softcap: float | None = None,
    visible_ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense float64 softmax(QK^T)V per request with an explicit bottom-right causal mask (and
    window, and cap; ``visible_ends``: each row sees the keys before its entry)."""
    q, k_cache, v_cache, tables, ctx_lens, starts, _, _, scale = batch.args
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64)
    for r in range(tables.shape[0]):
        ctx, s, e = int(ctx_lens[r]), int(starts[r]), int(starts[r + 1])
        slots = [(int(tables[r, p // block_size]), p % block_size) for p in range(ctx)]
        k = torch.stack([k_cache[b, i] for b, i in slots]).double().repeat_interleave(group, dim=1)
        v = torch.stack([v_cache[b, i] for b, i in slots]).double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[s:e].double(), k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(e - s).unsqueeze(1) + ctx - (e - s)
        ends = q_pos + 1 if visible_ends is None else visible_ends[s:e].cpu().unsqueeze(1)
        hidden = torch.arange(ctx).unsqueeze(0) >= ends
        if sliding_window is not None:
            hidden |= torch.arange(ctx).unsqueeze(0) <= q_pos - sliding_window
        scores = scores.masked_fill(hidden, -math.inf)
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def assert_close(actual, expected, dtype):
    """Within the dtype's tolerance, relative to the reference's magnitude, and NaN-free."""
    tol = TOLERANCE[dtype]
    assert not actual.isnan().any()
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


@pytest.fixture
def poisoned_allocations(monkeypatch):
    """Fill every float tensor from torch.empty / empty_like with NaN, so an unwritten output row shows."""

    def poisoned(alloc):
        def wrapper(*args, **kwargs):
            t = alloc(*args, **kwargs)
            return t.fill_(math.nan) if t.is_floating_point() else t

        return wrapper

    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_torch_attention_matches_naive(scenario, group, block_size):
    q_lens, ctx_lens = SCENARIOS[scenario]
    batch = make_batch(
        q_lens,
        ctx_lens,
        num_kv_heads=2,
        group=group,
        head_dim=64,
        block_size=block_size,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    expected = naive_attention(batch)
    torch.testing.assert_close(reference_attention(batch).double(), expected, rtol=1e-5, atol=1e-5)


# Sliding windows shorter than a block, spanning blocks, and longer than some contexts; Gemma 2's soft-cap.
MASKINGS = {
    "window 5": dict(sliding_window=5),
    "window 20": dict(sliding_window=20),
    "softcap": dict(softcap=2.0),
    "window and softcap": dict(sliding_window=12, softcap=2.0),
}


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_torch_attention_window_and_softcap_match_naive(scenario, masking):
    q_lens, ctx_lens = SCENARIOS[scenario]
    batch = make_batch(
        q_lens,
        ctx_lens,
        num_kv_heads=2,
        group=3,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    expected = naive_attention(batch, **MASKINGS[masking])
    actual = reference_attention(batch, **MASKINGS[masking])
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-5)


def image_rows_batch(dtype, device=DEVICE) -> tuple[Batch, torch.Tensor]:
    """A step of four requests where two compute a run of image tokens that sees itself whole
    (Gemma 3): the first's rows 2 to 5 (positions 2 to 5) see up to position 6, the third's
    rows 2 to 8 (positions 35 to 41) up to 42; every other row is causal."""
    q_lens, ctx_lens = SCENARIOS["mixed"]
    batch = make_batch(
        q_lens,
        ctx_lens,
        num_kv_heads=2,
        group=3,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        device=device,
    )
    positions = torch.cat([torch.arange(c - q, c) for q, c in zip(q_lens, ctx_lens)])
    ends = positions + 1
    ends[2:6] = 6
    ends[8 + 2 : 8 + 9] = 42
    return batch, ends.to(torch.int32).to(device)


@pytest.mark.parametrize("masking", [{}, *MASKINGS.values()], ids=["causal", *MASKINGS])
def test_torch_attention_rows_that_see_their_image_match_naive(masking):
    batch, ends = image_rows_batch(torch.float32, torch.device("cpu"))
    expected = naive_attention(batch, **masking, visible_ends=ends)
    actual = reference_attention(batch, **masking, visible_ends=ends)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-5)
    causal = reference_attention(batch, **masking)
    assert not torch.allclose(actual, causal)
    text_rows = [0, 1, 6, 7, 8, 9, 17, 18, 19, 20]
    torch.testing.assert_close(actual[text_rows], causal[text_rows])


@needs_triton
@pytest.mark.parametrize(
    "masking", [{}, MASKINGS["window and softcap"]], ids=["causal", "window and softcap"]
)
def test_triton_attention_rows_that_see_their_image_match_naive(masking):
    batch, ends = image_rows_batch(torch.float32)
    q, k, v, *rest = batch.args
    actual = triton_attention.paged_attention(
        q, k.nan_to_num(), v.nan_to_num(), *rest, **masking, visible_ends=ends
    )
    assert_close(actual, naive_attention(batch, **masking, visible_ends=ends), torch.float32)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_unified_attention_window_and_softcap(poisoned_allocations, dtype, scenario, masking):
    q_lens, ctx_lens = SCENARIOS[scenario]
    batch = make_batch(
        q_lens, ctx_lens, num_kv_heads=2, group=3, head_dim=64, block_size=16, dtype=dtype
    )
    actual = triton_attention.unified_attention(*batch.args, **MASKINGS[masking])
    assert_close(actual, reference_attention(batch, **MASKINGS[masking]), dtype)


@needs_triton
@pytest.mark.parametrize("masking", MASKINGS)
def test_split_k_decode_window_and_softcap(poisoned_allocations, masking):
    batch = make_batch(
        [1, 1, 1],
        [70, 5, 33],
        num_kv_heads=2,
        group=3,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
    )
    q, k, v, tables, ctx_lens, *_, scale = batch.args
    out = triton_attention.split_k_decode_attention(
        q, k, v, tables, ctx_lens, scale, 3, **MASKINGS[masking]
    )
    assert_close(out, reference_attention(batch, **MASKINGS[masking]), torch.float32)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_unified_attention_matches_torch(
    poisoned_allocations, dtype, scenario, group, head_dim, block_size
):
    q_lens, ctx_lens = SCENARIOS[scenario]
    batch = make_batch(
        q_lens,
        ctx_lens,
        num_kv_heads=2,
        group=group,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    assert_close(triton_attention.unified_attention(*batch.args), reference_attention(batch), dtype)


@needs_triton
def test_query_tiles_are_packed_only_where_fewer():
    # Decode, drafts and a lone prompt: every request gets the longest one's tiles, as many
    # programs as tiles of work. A chunk among decodes: packed, each request's tiles after the last.
    assert triton_attention.query_tile_grid(256, 256, 1, 4) == (256, 1)
    assert triton_attention.query_tile_grid(64, 320, 5, 8) == (64, 1)
    assert triton_attention.query_tile_grid(1, 2048, 2048, 16) == (128, 128)
    assert triton_attention.query_tile_grid(256, 2255, 2000, 16) == (396, 0)
    q_lens = SCENARIOS["skewed"][0]
    assert triton_attention.query_tile_grid(len(q_lens), sum(q_lens), max(q_lens), 16) == (10, 0)


@needs_triton
@pytest.mark.parametrize("group", [3, 4])
def test_packed_query_tiles_cover_chunks_that_straddle_tiles(poisoned_allocations, group):
    # Chunks of 5 to 40 tokens starting anywhere in a tile of 16, among decodes and an empty query
    # (a padding request): every row of every request is attended once, as the reference does.
    q_lens = [1, 17, 0, 1, 40, 5, 1, 31, 1, 1]
    ctx_lens = [3, 17, 4, 50, 40, 21, 8, 60, 33, 2]
    batch = make_batch(
        q_lens,
        ctx_lens,
        num_kv_heads=2,
        group=group,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
    )
    # 16 query rows a tile (4 padded heads per KV head): packed.
    assert triton_attention.query_tile_grid(len(q_lens), 98, 40, 16)[1] == 0
    assert_close(
        triton_attention.unified_attention(*batch.args), reference_attention(batch), torch.float32
    )


@needs_triton
@pytest.mark.parametrize("head_dim,block_size", [(64, 32), (128, 16), (128, 128)])
def test_unified_attention_long_prefill_spans_tiles(head_dim, block_size):
    # 70 new tokens need several query tiles per request; the first request is a fresh prompt. A KV
    # tile spans several pages (block 16, 32), or a page holds several tiles (block 128).
    batch = make_batch(
        [70, 1, 33],
        [70, 20, 50],
        num_kv_heads=1,
        group=4,
        head_dim=head_dim,
        block_size=block_size,
        dtype=torch.float32,
    )
    assert_close(
        triton_attention.unified_attention(*batch.args), reference_attention(batch), torch.float32
    )


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_k_decode_matches_torch(
    poisoned_allocations, dtype, group, head_dim, block_size, num_splits
):
    # The 5-token context has a single page, so most of its partitions are empty.
    batch = make_batch(
        [1, 1, 1],
        [70, 5, 33],
        num_kv_heads=2,
        group=group,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    q, k, v, tables, ctx_lens, *_, scale = batch.args
    out = triton_attention.split_k_decode_attention(q, k, v, tables, ctx_lens, scale, num_splits)
    assert_close(out, reference_attention(batch), dtype)


@needs_triton
@pytest.mark.parametrize("kv_tile", [16, 32, 128])
@pytest.mark.parametrize("num_splits", [None, 3], ids=["unified", "split-k"])
def test_every_tiling_attends_the_same(poisoned_allocations, kv_tile, num_splits):
    # The tilings `gpu_check` sweeps: a tile of one page, of two, and of eight (more than the
    # 70-position context, so one tile holds the whole of it).
    batch = make_batch(
        [1, 1, 1] if num_splits else [7, 1, 12],
        [70, 5, 33] if num_splits else [7, 70, 45],
        num_kv_heads=2,
        group=4,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
    )
    tiling = triton_attention.Tiling(kv_tile, num_warps=8, num_stages=2)
    if num_splits:
        q, k, v, tables, ctx_lens, *_, scale = batch.args
        out = triton_attention.split_k_decode_attention(
            q, k, v, tables, ctx_lens, scale, num_splits, tiling=tiling
        )
    else:
        out = triton_attention.unified_attention(*batch.args, tiling=tiling)
    assert_close(out, reference_attention(batch), torch.float32)


@needs_triton
@pytest.mark.parametrize("kv_tile", [8, 24, 256])
def test_a_tile_the_kernels_cannot_take_is_refused(kv_tile):
    with pytest.raises(ValueError, match="power of two in 16..128"):
        triton_attention.Tiling(kv_tile)


@needs_triton
@pytest.mark.parametrize("splits", [1, 4], ids=["split-k off", "split-k on"])
def test_paged_attention_dispatch(monkeypatch, splits):
    chosen = []

    def forced(*args):
        chosen.append(splits)
        return splits

    monkeypatch.setattr(triton_attention, "num_kv_splits", forced)
    batch = make_batch(
        [1, 1], [90, 41], num_kv_heads=2, group=3, head_dim=64, block_size=16, dtype=torch.float32
    )
    assert_close(
        triton_attention.paged_attention(*batch.args), reference_attention(batch), torch.float32
    )
    assert chosen == [splits]


@needs_triton
def test_num_kv_splits_heuristic():
    split = triton_attention.num_kv_splits
    shortest = triton_attention._MIN_TOKENS_PER_SPLIT
    decode = {"num_reqs": 2, "num_kv_heads": 8, "num_tokens": 2, "max_query_len": 1}
    # Few long decodes on a 132-SM GPU: about two programs per SM, within the split cap.
    assert split(**decode, max_context_len=8192, num_sms=132) == 17
    # Bounded by the context length: no partition shorter than the minimum.
    assert split(**decode, max_context_len=5 * shortest + 1, num_sms=132) == 5
    # Short contexts, a full GPU, or any prefill row: no split.
    assert split(**decode, max_context_len=2 * shortest - 1, num_sms=132) == 1
    full = {"num_reqs": 64, "num_kv_heads": 8, "num_tokens": 64, "max_query_len": 1}
    assert split(**full, max_context_len=8192, num_sms=132) == 1
    prefill = {"num_reqs": 2, "num_kv_heads": 8, "num_tokens": 9, "max_query_len": 8}
    assert split(**prefill, max_context_len=8192, num_sms=132) == 1


STORE_DTYPES = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
    (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32),
]


@needs_triton
@pytest.mark.parametrize("src_dtype,cache_dtype", STORE_DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
def test_store_kv_matches_torch(src_dtype, cache_dtype, block_size):
    gen = torch.Generator().manual_seed(1)
    num_blocks, kv_heads, head_dim = 4, 3, 64
    # Keys and values as column slices of a fused qkv tensor; tokens 1 and 4 are padding (slot -1).
    qkv = torch.randn(6, 4 * kv_heads, head_dim, generator=gen).to(src_dtype)
    key, value = qkv[:, 2 * kv_heads : 3 * kv_heads].to(DEVICE), qkv[:, 3 * kv_heads :].to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:6]
    slots[[1, 4]] = -1
    shape = (num_blocks, block_size, kv_heads, head_dim)
    caches = [torch.full(shape, math.nan, dtype=cache_dtype, device=DEVICE) for _ in range(4)]
    torch_attention.store_kv(key, value, caches[0], caches[1], slots.to(DEVICE))
    triton_store_kv.store_kv(key, value, caches[2], caches[3], slots.to(DEVICE))
    # The interpreter truncates fp32 -> bf16 where CUDA rounds to nearest: allow one bf16 ulp there.
    narrowing = cache_dtype.itemsize < src_dtype.itemsize and DEVICE.type == "cpu"
    tol = 2**-7 if narrowing else 0.0
    for ours, theirs in ((caches[2], caches[0]), (caches[3], caches[1])):
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=tol, atol=tol, equal_nan=True)
    assert caches[2].isnan().sum() == (num_blocks * block_size - 4) * kv_heads * head_dim


def test_select_backend_auto_and_forced():
    assert backend.select_backend(torch.device("cpu")).name == "cpu"
    assert backend.select_backend(torch.device("cpu"), "auto").name == "cpu"
    assert backend.select_backend(torch.device("cuda"), "torch").name == "torch"
    assert (
        backend.select_backend(torch.device("cpu"), "torch").paged_attention
        is torch_attention.paged_attention
    )
    with pytest.raises(ValueError, match="unknown attention backend"):
        backend.select_backend(torch.device("cpu"), "flash")


@needs_triton
def test_select_backend_triton():
    chosen = backend.select_backend(torch.device("cuda"))
    assert chosen.name == "triton"
    assert chosen.store_kv is triton_store_kv.store_kv
    assert chosen.paged_attention is triton_attention.paged_attention
    assert backend.select_backend(torch.device("cpu"), "triton").name == "triton"


def test_select_backend_without_triton(monkeypatch):
    find_spec = backend.importlib.util.find_spec
    monkeypatch.setattr(
        backend.importlib.util,
        "find_spec",
        lambda name: None if name == "triton" else find_spec(name),
    )
    with pytest.raises(ImportError, match="needs the 'triton' package"):
        backend.select_backend(torch.device("cpu"), "triton")


@needs_triton
@pytest.mark.parametrize("group,num_splits", [(4, 1), (4, 40), (1, 64), (7, 23)])
def test_split_k_merges_any_count_and_leaves_its_counters_at_zero(
    poisoned_allocations, group, num_splits
):
    # More partitions than one merge chunk holds (64 rows: 16 partitions of 4 heads, 64 of one head,
    # 8 of 7 padded to 8), and a second call on the same counters gives the same output.
    batch = make_batch(
        [1, 1],
        [600, 97],
        num_kv_heads=2,
        group=group,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
    )
    q, k, v, tables, ctx_lens, *_, scale = batch.args
    tiling = triton_attention.Tiling(16)
    first = triton_attention.split_k_decode_attention(
        q, k, v, tables, ctx_lens, scale, num_splits, tiling=tiling
    )
    assert not triton_attention._merge_counters_buffer(q.device).any()
    again = triton_attention.split_k_decode_attention(
        q, k, v, tables, ctx_lens, scale, num_splits, tiling=tiling
    )
    assert_close(first, reference_attention(batch), torch.float32)
    assert torch.equal(first, again)
