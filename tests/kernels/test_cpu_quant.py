"""The block-quantized CPU matmul, each block type on each runnable kernel variant, against torch references.

The reference dequantizes the weights with gguf's own code and multiplies in float64. The kernel
quantizes each activation row to int8 per 32 values (as llama.cpp does), so it is compared twice:
tightly with a reference fed the same int8 activations, loosely with the exact float product.
Shapes cover partial groups of 8 weight rows, passes of 1, 2 and 3 activation rows and more than
one 64-row chunk.
"""

import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize

from spyglass.kernels import cpu_isa, cpu_quant

SHAPES = [
    (1, 33, 64),
    (3, 100, 256),
    (1, 576, 1536),
    (67, 257, 576),
    (127, 9, 32),
    (130, 16, 96),
    (2, 40, 64),
]  # (M, N, K): odd M, N; K % 32 == 0


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """x rounded as the kernel sees it: per 32 values, int8 with scale max|x| / 127."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    return (blocks / scale.clamp_min(1e-30)).round().mul(scale).reshape(x.shape)


def quantized_weight(n: int, k: int, qtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Random blocks of ``qtype`` and their values as gguf dequantizes them (float64)."""
    blocks = quantize(np.random.default_rng(n * k).standard_normal((n, k), dtype=np.float32), qtype)
    return torch.from_numpy(blocks), torch.from_numpy(dequantize(blocks, qtype)).double()


@pytest.mark.parametrize("qtype", cpu_quant.SUPPORTED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_matmul_matches_dequantized_reference(native_kernels, qtype, m, n, k):
    blocks, weight = quantized_weight(n, k, qtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + n))
    y = cpu_quant.matmul(x, cpu_quant.pack(blocks, qtype, n, k), qtype, n, k)
    assert y.shape == (m, n) and y.dtype == torch.float32
    same_inputs = quantized_activations(x) @ weight.T
    torch.testing.assert_close(
        y.double(), same_inputs, rtol=1e-4, atol=1e-3 * same_inputs.abs().max().item()
    )
    exact = x.double() @ weight.T
    assert (y.double() - exact).norm() / exact.norm() < 2e-2


def test_matmul_keeps_leading_dims_and_dtype(native_kernels):
    qtype = cpu_quant.SUPPORTED_TYPES[1]
    blocks, weight = quantized_weight(40, 64, qtype)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    y = cpu_quant.matmul(x, cpu_quant.pack(blocks, qtype, 40, 64), qtype, 40, 64)
    assert y.shape == (2, 3, 40) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), x.double() @ weight.T, rtol=5e-2, atol=0.3)


@pytest.mark.parametrize("qtype", cpu_quant.SUPPORTED_TYPES, ids=lambda t: t.name)
def test_dequantize_rows_equals_gguf(native_kernels, qtype):
    blocks, weight = quantized_weight(50, 96, qtype)
    torch.testing.assert_close(
        cpu_quant.dequantize_rows(blocks, qtype, 96).double(), weight, rtol=1e-6, atol=1e-6
    )
    row_ids = torch.tensor([49, 0, 7, 7])
    torch.testing.assert_close(
        cpu_quant.dequantize_rows(blocks, qtype, 96, row_ids).double(),
        weight[row_ids],
        rtol=1e-6,
        atol=1e-6,
    )


AMX_HOST = {"amx_tile", "amx_int8"} <= cpu_isa.cpu_flags()


@pytest.mark.skipif(not AMX_HOST, reason="AMX-INT8 runs only on a CPU that has it")
@pytest.mark.parametrize("qtype", cpu_quant.SUPPORTED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m, n, k", [(16, 16, 32), (17, 40, 64), (67, 257, 576), (130, 48, 96)])
def test_amx_tiles_give_the_vector_paths_bits(qtype, m, n, k):
    """Whole 16x16 tiles on AMX, the rest (rows past the tiles, a group without a pair) on the
    vector path: the same bits as all on the vector path, which the reference test checks."""
    kernels = cpu_quant.QuantKernels(cpu_isa.best_variant())
    blocks, weight = quantized_weight(n, k, qtype)
    packed = kernels.pack(blocks, qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m * n))
    assert kernels.use_amx(True)
    on_tiles = kernels.matmul(x, packed, qtype, n, k)
    try:  # the switch is the loaded library's: every later user of this variant sees it
        assert not kernels.use_amx(False)
        assert torch.equal(on_tiles, kernels.matmul(x, packed, qtype, n, k))
    finally:
        kernels.use_amx(True)
    same_inputs = quantized_activations(x) @ weight.T
    torch.testing.assert_close(
        on_tiles.double(), same_inputs, rtol=1e-4, atol=1e-3 * same_inputs.abs().max().item()
    )


@pytest.mark.parametrize("variant", cpu_isa.runnable_variants(), ids=lambda v: v.name)
def test_amx_is_used_only_where_the_build_and_the_cpu_have_it(variant):
    kernels = cpu_quant.QuantKernels(variant)
    expected = AMX_HOST and "avx512f" in variant.requires  # the AVX-512 builds have the AMX path
    assert kernels.amx == expected
    assert kernels.use_amx(True) == expected
