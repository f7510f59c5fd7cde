"""Quantized matrices of types the CPU kernels do not multiply (Q4_K, Q5_0, Q6_K in Q4_K_M files; Q2_K..Q5_K,
Q5_1, IQ types) are rewritten at load into blocks they do.

The reference is gguf's own dequantization of the same file (``--quantization none``).
"""

import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.loaders.gguf_loader import load_gguf
from spyglass.core.loaders.gguf_transcode import target_type, transcode
from spyglass.core.models.linear import Linear, QuantizedLinear
from spyglass.core.models.quantization import weight_bytes
from tests.core.conftest import random_k_quant_blocks


def test_q5_0_blocks_become_q8_0_blocks_of_equal_values():
    blocks = quantize(np.random.default_rng(3).standard_normal((8, 576), dtype=np.float32), Q.Q5_0)
    rewritten, new_type = transcode(blocks, Q.Q5_0)
    assert new_type == Q.Q8_0
    np.testing.assert_array_equal(dequantize(rewritten, new_type), dequantize(blocks, Q.Q5_0))


@pytest.mark.parametrize(
    "qtype, target",
    [(Q.Q4_K, Q.Q4_1), (Q.Q6_K, Q.Q8_0), (Q.Q5_K, Q.Q8_0), (Q.Q3_K, Q.Q8_0), (Q.Q2_K, Q.Q8_0)],
)
def test_k_quant_blocks_keep_their_values(qtype, target):
    blocks = random_k_quant_blocks(np.random.default_rng(1), qtype, 24, 768)
    want = dequantize(blocks, qtype)
    assert 0.005 < np.abs(want).mean() < 0.1  # weights of a realistic size
    rewritten, new_type = transcode(blocks, qtype)
    assert new_type == target == target_type(qtype) and rewritten.dtype == np.uint8
    got = dequantize(rewritten, new_type)
    if qtype == Q.Q4_K:
        # The same 16 levels per 32 values, d' * q + m': only d' and m' are rounded to float16
        # (relative 2^-11 each), so a value moves by at most 2^-11 * (15 |d'| + |m'|).
        scales = rewritten.reshape(24, -1, 20)[..., 0:4].copy().view(np.float16).astype(np.float32)
        bound = 2**-11 * (15 * np.abs(scales[..., 0]) + np.abs(scales[..., 1]))
        error = np.abs(got - want).reshape(24, -1, 32)
        assert (error <= bound[..., None] * 1.001).all()
        assert error.max() > 0  # the levels really were recomputed, not copied from the reference
    else:
        # Requantized to int8 per 32 values: half a step of each block's grid, plus the float16
        # rounding of its scale (relative 2^-11) over up to 127 steps.
        step = np.abs(want).reshape(24, -1, 32).max(axis=-1, keepdims=True) / 127
        assert (np.abs(got - want).reshape(24, -1, 32) <= step * (0.5 + 127 * 2**-11)).all()


def test_q5_1_and_iq4_nl_blocks_become_q8_0_and_floats_stay_floats():
    values = np.random.default_rng(4).standard_normal((8, 256), dtype=np.float32) * 0.02
    blocks = quantize(values, Q.Q5_1)
    rewritten, new_type = transcode(blocks, Q.Q5_1)
    step = np.abs(values).max() / 127
    assert new_type == Q.Q8_0
    assert np.abs(dequantize(rewritten, new_type) - dequantize(blocks, Q.Q5_1)).max() <= step
    assert target_type(Q.IQ4_NL) == Q.Q8_0 and target_type(Q.Q4_0) == Q.Q4_0
    assert target_type(Q.F16) is None and target_type(Q.BF16) is None and target_type(Q.F32) is None


def test_q4_k_scales_that_overflow_float16_are_left_to_dequantize():
    blocks = random_k_quant_blocks(np.random.default_rng(2), Q.Q4_K, 8, 256).reshape(8, 1, 144)
    blocks[..., 0:2] = np.full((8, 1, 1), 60000.0, dtype=np.float16).view(np.uint8)
    assert transcode(blocks.reshape(8, -1), Q.Q4_K) is None


def _engine(path, quantization):
    config = EngineConfig(
        model=str(path),
        dtype="float32",
        device="cpu",
        quantization=quantization,
        plugins=["fcfs"],
        num_kv_blocks=64,
    )
    return LLMEngine(config)


def test_a_q4_k_m_file_is_multiplied_in_blocks_and_agrees_with_gguf_dequantized(
    k_quant_gguf, run_engine, caplog
):
    kept, dequantized = _engine(k_quant_gguf, "auto"), _engine(k_quant_gguf, "none")
    layer, float_layer = kept.runner.model.layers[0], dequantized.runner.model.layers[0]
    for linear, reference in [
        (layer.attention.qkv, float_layer.attention.qkv),
        (layer.mlp.gate_up, float_layer.mlp.gate_up),
        (layer.mlp.down, float_layer.mlp.down),
    ]:
        assert isinstance(linear, QuantizedLinear) and isinstance(reference, Linear)
        x = torch.randn(3, linear.shape[1])
        want = reference(x)
        # The kernels round activations to int8 per 32 values, as llama.cpp does.
        assert (linear(x) - want).norm() / want.norm() < 2e-2
    assert kept.runner.model.layers[0].mlp.down.qtype == Q.Q8_0
    # Q4_1 at 5 bits and Q8_0 at 8.5 bits a weight, against 32 for the dequantized floats.
    with caplog.at_level(logging.INFO, logger="spyglass.core.loaders.gguf_loader"):
        blocks = load_gguf(k_quant_gguf, torch.float32, keep_quantized=True).weights
    # 2 layers x 6 Q4_K matrices; 2 down projections and the embedding in Q6_K.
    assert "Q4_K as Q4_1 (12 matrices), Q6_K as Q8_0 (3 matrices)" in caplog.text
    floats = load_gguf(k_quant_gguf, torch.float32).weights
    assert weight_bytes(blocks) < 0.3 * weight_bytes(floats)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for want, got in zip(
        run_engine(dequantized, prompts, params), run_engine(kept, prompts, params), strict=True
    ):
        assert got.outputs[0].token_ids[0] == want.outputs[0].token_ids[0]
