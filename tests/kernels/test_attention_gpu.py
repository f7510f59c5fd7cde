"""Triton attention kernels against the torch versions on CUDA at serving-sized shapes (contexts to 8k, batches to 64).

Batch building and the reference come from test_attention_kernels.py, loaded by path (tests are not a package).
"""

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _load_helpers():
    """The sibling CPU test module, for `make_batch`, `reference_attention` and `assert_close`."""
    path = Path(__file__).with_name("test_attention_kernels.py")
    spec = importlib.util.spec_from_file_location("attention_kernel_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _load_helpers()
triton_attention, triton_store_kv = helpers.triton_attention, helpers.triton_store_kv
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ragged(n: int, low: int, high: int, seed: int) -> list[int]:
    """``n`` random lengths in ``[low, high]``."""
    return torch.randint(
        low, high + 1, (n,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def _check(run, batch, dtype):
    helpers.assert_close(run(*batch.args), helpers.reference_attention(batch), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", ["auto", "unified", "split-k"])
def test_decode_batch_of_64_long_contexts(dtype, path):
    ctx = _ragged(64, 1, 8192, seed=0)
    batch = helpers.make_batch(
        [1] * 64, ctx, num_kv_heads=2, group=4, head_dim=128, block_size=16, dtype=dtype
    )
    q, k, v, tables, lens, *_, scale = batch.args
    run = {
        "auto": triton_attention.paged_attention,
        "unified": triton_attention.unified_attention,
        "split-k": lambda *_: triton_attention.split_k_decode_attention(
            q, k, v, tables, lens, scale, 8
        ),
    }[path]
    _check(run, batch, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [1, 3, 4])
def test_split_k_few_requests_8k(dtype, group):
    batch = helpers.make_batch(
        [1] * 4,
        [8192, 8000, 4097, 33],
        num_kv_heads=2,
        group=group,
        head_dim=128,
        block_size=16,
        dtype=dtype,
    )
    # 4 requests x 2 KV heads leave any real GPU mostly idle, so the heuristic must split.
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert triton_attention.num_kv_splits(4, 2, 4, 1, 8192, sms) > 1
    _check(triton_attention.paged_attention, batch, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim,block_size", [(64, 32), (128, 16)])
def test_mixed_prefill_drafts_decode(dtype, head_dim, block_size):
    # 32 requests: chunked prefills, a fresh prompt, 3-4 token drafts and plain decodes.
    q_lens = [512, 1000, 1, 3, 4, 1] * 5 + [2048, 1]
    ctx = [max(q, c) for q, c in zip(q_lens, _ragged(32, 1, 8192, seed=1))]
    ctx[-2] = 2048
    batch = helpers.make_batch(
        q_lens, ctx, num_kv_heads=4, group=3, head_dim=head_dim, block_size=block_size, dtype=dtype
    )
    _check(triton_attention.paged_attention, batch, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "masking", [dict(sliding_window=4096), dict(sliding_window=500, softcap=50.0)], ids=str
)
@pytest.mark.parametrize("decode_only", [True, False], ids=["decode", "mixed"])
def test_sliding_window_and_softcap_long_contexts(dtype, masking, decode_only):
    # Mistral's and Gemma 2's settings over contexts up to 8k, through whichever kernel paged_attention picks.
    q_lens = [1] * 8 if decode_only else [1, 700, 1, 3, 1, 2048, 1, 4]
    ctx = [max(q, c) for q, c in zip(q_lens, _ragged(8, 1, 8192, seed=3))]
    batch = helpers.make_batch(
        q_lens, ctx, num_kv_heads=2, group=4, head_dim=128, block_size=16, dtype=dtype
    )
    actual = triton_attention.paged_attention(*batch.args, **masking)
    helpers.assert_close(actual, helpers.reference_attention(batch, **masking), dtype)


@pytest.mark.parametrize("cache_dtype", DTYPES, ids=str)
def test_store_kv_8k_tokens(cache_dtype):
    gen = torch.Generator().manual_seed(2)
    num_tokens, kv_heads, head_dim, block_size = 8192, 8, 128, 16
    kv = torch.randn(num_tokens, 2 * kv_heads, head_dim, generator=gen).to(torch.bfloat16).cuda()
    key, value = kv[:, :kv_heads], kv[:, kv_heads:]
    slots = torch.randperm(2 * num_tokens, generator=gen)[:num_tokens]
    slots[::7] = -1
    shape = (2 * num_tokens // block_size, block_size, kv_heads, head_dim)
    caches = [torch.zeros(shape, dtype=cache_dtype, device="cuda") for _ in range(4)]
    helpers.torch_attention.store_kv(key, value, caches[0], caches[1], slots.cuda())
    triton_store_kv.store_kv(key, value, caches[2], caches[3], slots.cuda())
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
