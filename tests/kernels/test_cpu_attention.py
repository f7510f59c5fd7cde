"""The CPU fast path (head-major cache) against the torch reference, on the same data in both layouts.

Both CPU paths are checked: the compiled kernel and the pure-torch fallback that runs where no
compiler is found.
"""

import pytest
import torch

from spyglass.kernels import backend, cpu_attention, cpu_native, torch_attention


def _to_head_major(cache: torch.Tensor) -> torch.Tensor:
    return cache.permute(2, 0, 1, 3).contiguous()


def _paged_inputs(generator, q_lens, context_lens, shape, num_heads, dtype, cache_dtype):
    """Random query rows and caches (``shape`` is the reference layout's) with shuffled block tables,
    and the reference's remaining positional arguments."""
    num_blocks, head_dim = shape[0], shape[3]
    max_blocks = num_blocks // len(q_lens)
    block_tables = (
        torch.randperm(num_blocks, generator=generator)
        .view(len(q_lens), max_blocks)
        .to(torch.int32)
    )
    k_cache = torch.randn(shape, generator=generator).to(cache_dtype)
    v_cache = torch.randn(shape, generator=generator).to(cache_dtype)
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=generator).to(dtype)
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    args = (block_tables, lens, starts, max(q_lens), max(context_lens), head_dim**-0.5)
    return query, k_cache, v_cache, args


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("q_lens", [[1, 1, 1, 1], [7, 1, 16, 1, 3], [40], [1, 17, 1, 2], [1] * 9])
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, block_size, head_dim",
    # Head dims 32/64/128 with even blocks take the vectorised bf16 path (blocks shorter than its
    # 16-key step included); 48 and odd block sizes take the generic one.
    [(9, 3, 16, 64), (4, 4, 8, 128), (8, 2, 32, 64), (6, 2, 16, 48), (4, 1, 6, 32), (2, 2, 5, 64)],
)
def test_cpu_attention_matches_reference(
    dtype, tolerance, q_lens, num_heads, num_kv_heads, block_size, head_dim, cpu_kernels
):
    generator = torch.Generator().manual_seed(len(q_lens) * 100 + num_heads)
    # Up to 300 keys: contexts span many blocks, odd and even lengths, partial last blocks.
    context_lens = [q + 37 * i + (3 if q == 1 else 0) for i, q in enumerate(q_lens)]
    max_blocks = max(-(-c // block_size) for c in context_lens)
    num_blocks = len(q_lens) * max_blocks + 3
    block_tables = torch.randperm(num_blocks, generator=generator)[: len(q_lens) * max_blocks]
    block_tables = block_tables.view(len(q_lens), max_blocks).to(torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    # Query rows are a strided view, as they are when sliced out of the fused qkv projection.
    query = torch.randn(sum(q_lens), num_heads + 2, head_dim, generator=generator).to(dtype)[
        :, :num_heads
    ]
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    args = (block_tables, lens, starts, max(q_lens), max(context_lens), head_dim**-0.5)
    expected = torch_attention.paged_attention(query, k_cache, v_cache, *args)
    actual = cpu_attention.paged_attention(
        query, _to_head_major(k_cache), _to_head_major(v_cache), *args
    )
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("q_lens", [[1, 1, 1, 1], [7, 1, 16, 1, 3], [1, 17, 1, 2]])
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, block_size, head_dim, masking",
    # Head dims 32/64/128 take the vectorised float32 path; 48, a window or a soft-cap the generic one.
    [
        (9, 3, 16, 64, {}),
        (4, 4, 8, 128, {}),
        (4, 1, 6, 32, {}),
        (6, 2, 16, 48, {}),
        (6, 2, 16, 64, dict(sliding_window=17, softcap=3.0)),
    ],
)
def test_cpu_attention_over_a_float16_cache_matches_reference(
    q_lens, num_heads, num_kv_heads, block_size, head_dim, masking, cpu_kernels
):
    """float32 queries over a float16 cache (--kv-cache-dtype float16): every float16 value is exact
    in float32, so the fast path must agree with the reference to float32 rounding."""
    generator = torch.Generator().manual_seed(len(q_lens) * 10 + head_dim)
    context_lens = [q + 41 * i + 2 for i, q in enumerate(q_lens)]
    max_blocks = max(-(-c // block_size) for c in context_lens)
    shape = (len(q_lens) * max_blocks, block_size, num_kv_heads, head_dim)
    query, k_cache, v_cache, args = _paged_inputs(
        generator, q_lens, context_lens, shape, num_heads, torch.float32, torch.float16
    )
    expected = torch_attention.paged_attention(query, k_cache, v_cache, *args, **masking)
    actual = cpu_attention.paged_attention(
        query, _to_head_major(k_cache), _to_head_major(v_cache), *args, **masking
    )
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    "masking",
    [
        dict(sliding_window=5),
        dict(sliding_window=40),
        dict(softcap=2.0),
        dict(sliding_window=17, softcap=3.0),
    ],
    ids=str,
)
@pytest.mark.parametrize("q_lens", [[1, 1, 1], [7, 1, 30, 2]])
def test_cpu_attention_window_and_softcap_match_reference(
    dtype, tolerance, masking, q_lens, cpu_kernels
):
    # Head dim 64 with an even block size: the shapes the vectorised bf16 path would take without masking.
    generator = torch.Generator().manual_seed(len(q_lens))
    num_heads, num_kv_heads, block_size, head_dim = 6, 2, 16, 64
    context_lens = [q + 29 * i + 3 for i, q in enumerate(q_lens)]
    max_blocks = max(-(-c // block_size) for c in context_lens)
    shape = (len(q_lens) * max_blocks, block_size, num_kv_heads, head_dim)
    query, k_cache, v_cache, args = _paged_inputs(
        generator, q_lens, context_lens, shape, num_heads, dtype, dtype
    )
    expected = torch_attention.paged_attention(query, k_cache, v_cache, *args, **masking)
    unmasked = torch_attention.paged_attention(query, k_cache, v_cache, *args)
    assert not torch.allclose(expected, unmasked)
    actual = cpu_attention.paged_attention(
        query, _to_head_major(k_cache), _to_head_major(v_cache), *args, **masking
    )
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tolerance, atol=tolerance)


def test_cpu_store_kv_writes_the_same_slots_as_the_reference():
    generator = torch.Generator().manual_seed(0)
    shape = (6, 4, 2, 8)
    key, value = (
        torch.randn(5, 2, 8, generator=generator),
        torch.randn(5, 2, 8, generator=generator),
    )
    slots = torch.tensor([3, -1, 17, 0, 23])
    k_ref, v_ref = torch.zeros(shape), torch.zeros(shape)
    torch_attention.store_kv(key, value, k_ref, v_ref, slots)
    k_fast = torch.zeros(cpu_attention.cache_shape(*shape))
    v_fast = torch.zeros(cpu_attention.cache_shape(*shape))
    cpu_attention.store_kv(key, value, k_fast, v_fast, slots)
    assert torch.equal(k_fast, _to_head_major(k_ref)) and torch.equal(v_fast, _to_head_major(v_ref))


def test_cpu_backend_name_says_which_kernels_run(monkeypatch):
    assert backend.select_backend(torch.device("cpu")).name == "cpu"
    monkeypatch.setattr(cpu_native, "build", lambda: False)
    assert backend.select_backend(torch.device("cpu")).name == "cpu-torch"


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("masking", [{}, dict(sliding_window=5, softcap=2.0)], ids=str)
def test_cpu_attention_rows_that_see_their_image_match_reference(
    dtype, tolerance, masking, cpu_kernels
):
    # Gemma 3's image rows see their whole image: the first request's rows 1 to 4, the third's
    # rows 3 to 20 see up to the end of their run; every other row is causal.
    generator = torch.Generator().manual_seed(7)
    q_lens, context_lens = [7, 1, 30, 2], [7, 40, 70, 12]
    shape = (4 * 5, 16, 2, 64)
    query, k_cache, v_cache, args = _paged_inputs(
        generator, q_lens, context_lens, shape, 6, dtype, dtype
    )
    positions = torch.cat([torch.arange(c - q, c) for q, c in zip(q_lens, context_lens)])
    ends = positions + 1
    ends[1:5] = 5
    ends[8 + 3 : 8 + 21] = 61
    ends = ends.to(torch.int32)
    expected = torch_attention.paged_attention(
        query, k_cache, v_cache, *args, **masking, visible_ends=ends
    )
    actual = cpu_attention.paged_attention(
        query, _to_head_major(k_cache), _to_head_major(v_cache), *args, **masking, visible_ends=ends
    )
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tolerance, atol=tolerance)
    causal = torch_attention.paged_attention(query, k_cache, v_cache, *args, **masking)
    assert not torch.allclose(expected.float(), causal.float(), atol=tolerance)
