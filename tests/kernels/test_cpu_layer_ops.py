"""The compiled CPU layer ops against their torch references (`torch_norm_rope`, the torch KV store)."""

import math

import pytest
import torch

from spyglass.core.models.rope import RotaryEmbedding
from spyglass.kernels import cpu_attention, cpu_native, torch_norm_rope

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
DTYPES = [torch.float32, torch.bfloat16]


pytestmark = pytest.mark.usefixtures("native_kernels")


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("num_tokens", [3, 300])  # 300 rows take the multi-threaded path
def test_add_rms_norm_matches_reference(dtype, with_residual, num_tokens):
    hidden = 576
    x = _randn(num_tokens, 2 * hidden, dtype=dtype, seed=0)[:, :hidden]  # strided rows
    residual = _randn(num_tokens, hidden, dtype=dtype, seed=1) if with_residual else None
    weight = _randn(hidden, dtype=dtype, seed=2)
    expected = torch_norm_rope.add_rms_norm(x, residual, weight, 1e-5)
    actual = cpu_native.add_rms_norm(x, residual, weight, 1e-5)
    for ours, theirs in zip(actual, expected):
        torch.testing.assert_close(
            ours.float(), theirs.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_matches_reference_and_leaves_v_alone(dtype, head_dim):
    rope = RotaryEmbedding(head_dim, 512, 10000.0, None, dtype, torch.device("cpu"))
    positions = torch.tensor([0, 5, 511, 17, 200])
    qkv = _randn(5, 7, head_dim, dtype=dtype, seed=3)
    ours, theirs = qkv.clone(), qkv.clone()
    cpu_native.rotary_embedding_(ours[:, :6], positions, rope.cos, rope.sin)
    torch_norm_rope.rotary_embedding_(theirs[:, :6], positions, rope.cos, rope.sin)
    torch.testing.assert_close(
        ours.float(), theirs.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
    )
    assert torch.equal(ours[:, 6], qkv[:, 6])


def test_rotary_at_position_zero_is_identity():
    rope = RotaryEmbedding(64, 8, 10000.0, None, torch.float32, torch.device("cpu"))
    x = _randn(1, 3, 64, dtype=torch.float32, seed=4)
    rotated = x.clone()
    cpu_native.rotary_embedding_(rotated, torch.tensor([0]), rope.cos, rope.sin)
    assert torch.equal(rotated, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens", [2, 100])
def test_silu_and_mul_matches_reference(dtype, num_tokens):
    gate_up = _randn(num_tokens, 2 * 1536, dtype=dtype, seed=5) * 4
    expected = torch_norm_rope.silu_and_mul(gate_up)
    actual = cpu_native.silu_and_mul(gate_up)
    torch.testing.assert_close(
        actual.float(), expected.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
    )
    assert math.isclose(
        float(cpu_native.silu_and_mul(torch.tensor([[1.0, 2.0]]))),
        2 / (1 + math.exp(-1)),
        rel_tol=1e-6,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_native_store_kv_writes_what_the_torch_store_writes(dtype, monkeypatch):
    shape = cpu_attention.cache_shape(6, 4, 2, 8)
    qkv = _randn(5, 6, 8, dtype=dtype, seed=6)  # q (2 heads) | k (2 heads) | v (2 heads)
    key, value = qkv[:, 2:4], qkv[:, 4:6]
    slots = torch.tensor([3, -1, 17, 0, 23])
    k_native, v_native = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    cpu_native.store_kv(key, value, k_native, v_native, slots)
    monkeypatch.setattr(cpu_native, "attends", lambda dtype, cache_dtype: False)
    k_torch, v_torch = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    cpu_attention.store_kv(key, value, k_torch, v_torch, slots)
    assert torch.equal(k_native, k_torch) and torch.equal(v_native, v_torch)
    assert k_native.count_nonzero() == 4 * 2 * 8  # the skipped token wrote nothing


def test_native_store_into_a_float16_cache_rounds_as_torch_does(native_kernels, monkeypatch):
    shape = cpu_attention.cache_shape(4, 4, 2, 8)
    qkv = _randn(5, 6, 8, dtype=torch.float32, seed=7) * 3
    # Values float16 cannot hold as they are: ties, subnormals, underflow, overflow, -0, inf, NaN.
    special = torch.tensor(
        [1 + 2**-11, 1 + 3 * 2**-11, 2**-20, 3 * 2**-25, 2**-26, 65519.0, 65520.0, 1e6]
        + [-0.0, float("inf"), -float("inf"), float("nan"), -(2**-25), 2**-24, 1e-8, -70000.0]
    )
    qkv[0, 2:4] = special.view(2, 8)
    key, value = qkv[:, 2:4], qkv[:, 4:6]
    slots = torch.tensor([3, -1, 15, 0, 9])
    k_native = torch.zeros(shape, dtype=torch.float16)
    v_native = torch.zeros(shape, dtype=torch.float16)
    cpu_native.store_kv(key, value, k_native, v_native, slots)
    monkeypatch.setattr(cpu_native, "attends", lambda dtype, cache_dtype: False)
    k_torch = torch.zeros(shape, dtype=torch.float16)
    v_torch = torch.zeros(shape, dtype=torch.float16)
    cpu_attention.store_kv(key, value, k_torch, v_torch, slots)
    # Compared as bits: NaN included, and -0 apart from +0.
    assert torch.equal(k_native.view(torch.int16), k_torch.view(torch.int16))
    assert torch.equal(v_native.view(torch.int16), v_torch.view(torch.int16))
