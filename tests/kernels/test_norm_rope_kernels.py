"""Triton RMSNorm-with-residual and rotary embedding against their torch versions (interpreter without CUDA)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before triton is first imported: it decides at @triton.jit time.
    os.environ["TRITON_INTERPRET"] = "1"

from spyglass.core.models.rope import RotaryEmbedding
from spyglass.kernels import torch_norm_rope

triton_norm_rope = pytest.importorskip("spyglass.kernels.triton_norm_rope")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(
        dtype=dtype, device=DEVICE
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("hidden", [64, 96])
def test_add_rms_norm_matches_torch(dtype, with_residual, hidden):
    # x is a column slice of a wider tensor: strided rows, as after a fused projection.
    x = _randn(5, 2 * hidden, dtype=dtype, seed=0)[:, :hidden]
    residual = _randn(5, hidden, dtype=dtype, seed=1) if with_residual else None
    weight = _randn(hidden, dtype=dtype, seed=2)
    expected = torch_norm_rope.add_rms_norm(x, residual, weight, 1e-6)
    actual = triton_norm_rope.add_rms_norm(x, residual, weight, 1e-6)
    tol = TOLERANCE[dtype]
    for ours, theirs in zip(actual, expected):
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_matches_torch(dtype, head_dim):
    rope = RotaryEmbedding(head_dim, 64, 10000.0, None, dtype, DEVICE)
    positions = torch.tensor([0, 5, 63, 17], device=DEVICE)
    qkv = _randn(4, 7, head_dim, dtype=dtype, seed=3)
    # Rotate the q and k heads of a fused qkv tensor in place; v (last head) must stay untouched.
    ours, theirs = qkv.clone(), qkv.clone()
    torch_norm_rope.rotary_embedding_(theirs[:, :6], positions, rope.cos, rope.sin)
    triton_norm_rope.rotary_embedding_(ours[:, :6], positions, rope.cos, rope.sin)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=tol, atol=tol)
    assert torch.equal(ours[:, 6], qkv[:, 6])
