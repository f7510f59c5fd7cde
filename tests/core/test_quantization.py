"""Quantized weights on the CPU: GGUF blocks kept at load, weight-only int8, and the model's greedy output.

The quantized model cannot match the float one exactly (its activations are rounded to int8 per
32 values, as llama.cpp's are); the test prints how many greedy tokens agree and requires most.
"""

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.loaders.gguf_loader import load_gguf
from spyglass.core.models.linear import Linear, QuantizedLinear
from spyglass.core.models.quantization import (
    QuantizedWeight,
    cat_rows,
    quantize_int8,
    resolve_mode,
    weight_bytes,
)
from tests.core.conftest import teacher_forced_agreement

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "你好，请介绍一下你自己。",
    "Once upon a time, there was a little robot named",
    "Translate to French: The weather is nice today, so we will walk to the market.",
    "List three primary colors:\n1.",
    "SELECT customer_id, COUNT(*) AS num_orders\nFROM orders\nWHERE",
    '{"name": "Alice", "age": 30, "languages": ["English", "French"], "address": {"city": "Paris", "zip":',
]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_int8_is_gguf_q8_0():
    weight = torch.randn(48, 96)
    quantized = quantize_int8(weight)
    assert quantized.qtype == GGMLQuantizationType.Q8_0 and quantized.shape == (48, 96)
    values = torch.from_numpy(dequantize(quantized.data.numpy(), quantized.qtype))
    torch.testing.assert_close(values, weight, rtol=0, atol=weight.abs().max().item() / 127)
    torch.testing.assert_close(quantized.dequantize(), values)


def test_cat_rows_keeps_blocks_of_one_type_and_dequantizes_a_mix():
    a, b = quantize_int8(torch.randn(8, 64)), quantize_int8(torch.randn(4, 64))
    joined = cat_rows([a, b])
    assert isinstance(joined, QuantizedWeight) and joined.shape == (12, 64)
    torch.testing.assert_close(joined.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    mixed = cat_rows([a, torch.ones(2, 64)])
    assert isinstance(mixed, torch.Tensor) and mixed.shape == (10, 64)
    four_bit = QuantizedWeight(
        torch.from_numpy(quantize(torch.randn(4, 64).numpy(), GGMLQuantizationType.Q4_0)),
        GGMLQuantizationType.Q4_0,
    )
    blocks = cat_rows([a, four_bit])  # mixed block types: all Q8_0, a's blocks untouched
    assert isinstance(blocks, QuantizedWeight) and blocks.qtype == GGMLQuantizationType.Q8_0
    assert torch.equal(blocks.data[:8], a.data)
    # Within half an int8 step, plus the float16 rounding of the new scale over up to 127 steps.
    step = four_bit.dequantize().abs().max() / 127
    assert (blocks.dequantize()[8:] - four_bit.dequantize()).abs().max() <= step * (
        0.5 + 127 * 2**-11
    )


def test_modes_resolve_per_device():
    assert resolve_mode("auto", torch.device("cpu")) == "auto"
    assert resolve_mode("auto", torch.device("cuda")) == "none"
    with pytest.raises(ValueError, match="int8"):
        resolve_mode("int8", torch.device("cuda"))
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="int4")


def test_int8_engine_multiplies_in_blocks(make_tiny_engine, run_engine):
    engine = make_tiny_engine(quantization="int8")
    model = engine.runner.model
    assert isinstance(model.layers[0].attention.qkv, QuantizedLinear) and isinstance(
        model.lm_head, QuantizedLinear
    )
    float_model = make_tiny_engine().runner.model
    assert isinstance(float_model.layers[0].attention.qkv, Linear)
    x = torch.randn(5, engine.arch.hidden_size)
    want = float_model.layers[0].mlp.gate_up(x)
    assert (model.layers[0].mlp.gate_up(x) - want).norm() / want.norm() < 2e-2
    (output,) = run_engine(engine, [[1, 2, 3]], GREEDY)
    assert len(output.outputs[0].token_ids) == 32


@pytest.mark.slow
def test_default_model_keeps_its_gguf_blocks(
    default_model_path, default_checkpoint, quantized_checkpoint
):
    weights = quantized_checkpoint.weights
    assert 90e6 < weight_bytes(weights) < 110e6 < weight_bytes(default_checkpoint.weights)
    layer = "model.layers.3.self_attn"
    for name in (f"{layer}.q_proj.weight", f"{layer}.k_proj.weight", "model.embed_tokens.weight"):
        assert isinstance(weights[name], QuantizedWeight)
        # Same rows as the float loader's (q and k rows are un-permuted as whole rows of blocks).
        torch.testing.assert_close(weights[name].dequantize(), default_checkpoint.weights[name])
    assert isinstance(weights["model.norm.weight"], torch.Tensor)


@pytest.fixture(scope="module")
def quantized_checkpoint(default_model_path):
    return load_gguf(default_model_path, torch.float32, keep_quantized=True)


@pytest.mark.slow
def test_quantized_default_model_agrees_with_float(
    make_default_engine, quantized_checkpoint, run_engine
):
    """Teacher-forced: at each of the float32 run's 32 greedy positions, the quantized model is
    given the same context and must mostly pick the same next token.

    Free-running agreement (tokens equal up to the first difference) measures chaos, not
    quantization: the int8 rounding of activations turns a 1e-7 change (another compiler's
    vectorisation of a norm) into a different rounding downstream, and one flipped near-tie parts
    the texts for good; between kernel variants of one host it read 90 to 168 of 256.
    """
    prompts = [make_default_engine().tokenizer.encode(p) for p in PROMPTS]
    floats = run_engine(make_default_engine(), prompts, GREEDY)
    quantized_engine = LLMEngine(
        EngineConfig(
            dtype="float32", device="cpu", plugins=["fcfs", "prefix_cache"], num_kv_blocks=256
        ),
        checkpoint=quantized_checkpoint,
    )
    agreeing, total = teacher_forced_agreement(quantized_engine, prompts, floats)
    print(f"\nquantized vs float32, teacher-forced: {agreeing} of {total} next tokens agree")
    assert agreeing >= 0.85 * total
