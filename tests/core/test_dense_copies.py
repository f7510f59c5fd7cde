"""``--quantization dual``: blocks plus a bf16 copy (`DualWeight`, `DualLinear`). Steps of a few rows
multiply the blocks, bigger steps the copy (AMX's fast path); the mode needs bf16 and room for the
copies, and the engine's output then still follows the float32 model's."""

import argparse

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.models import quantization
from spyglass.core.models.linear import DualLinear, Linear, QuantizedLinear, make_linear
from spyglass.core.models.quantization import (
    DualWeight,
    QuantizedWeight,
    cat_rows,
    check_dense_copies,
    resolve_mode,
    with_dense_copies,
)
from spyglass.kernels import cpu_isa
from tests.core.conftest import teacher_forced_agreement

AMX = frozenset({"amx_bf16", "avx512bw", "avx512vl", "avx512dq"})


def _blocks(n: int, k: int, seed: int) -> QuantizedWeight:
    values = np.random.default_rng(seed).standard_normal((n, k), dtype=np.float32)
    return QuantizedWeight(
        torch.from_numpy(quantize(values, GGMLQuantizationType.Q4_1)), GGMLQuantizationType.Q4_1
    )


def test_few_rows_multiply_the_blocks_and_more_the_copy():
    blocks = _blocks(40, 64, 0)
    (dual,) = with_dense_copies({"w": blocks}, torch.bfloat16).values()
    assert isinstance(dual, DualWeight) and dual.dense.dtype == torch.bfloat16
    assert torch.equal(dual.dense, blocks.dequantize().bfloat16())
    assert dual.nbytes == blocks.nbytes + 40 * 64 * 2
    linear = make_linear(dual)
    assert isinstance(linear, DualLinear)
    from_blocks, from_copy = QuantizedLinear(blocks), Linear(dual.dense)
    for rows in (1, DualLinear.DENSE_FROM_ROWS - 1, DualLinear.DENSE_FROM_ROWS, 33):
        x = torch.randn(rows, 64).bfloat16()
        want = (from_copy if rows >= DualLinear.DENSE_FROM_ROWS else from_blocks)(x)
        assert torch.equal(linear(x), want)


def test_fused_matrices_keep_their_copies():
    parts = [_blocks(16, 64, seed) for seed in (1, 2, 3)]
    duals = list(
        with_dense_copies({f"w{i}": p for i, p in enumerate(parts)}, torch.bfloat16).values()
    )
    fused = cat_rows(duals)
    assert isinstance(fused, DualWeight)
    assert torch.equal(fused.dense, torch.cat([d.dense for d in duals]))
    assert torch.equal(fused.data, torch.cat([p.data for p in parts]))


def test_dual_needs_bf16_room_and_blocks_and_names_a_cpu_without_amx(monkeypatch, caplog):
    weights = {
        "model.layers.0.mlp.down_proj.weight": _blocks(32, 64, 4),
        "model.layers.0.mlp.experts.down_proj.weight": _blocks(32, 64, 5),
        "model.norm.weight": torch.ones(64),
    }
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AMX)
    monkeypatch.setattr(quantization, "_available_memory", lambda: 4 * 32 * 64 * 2)
    check_dense_copies(weights, torch.bfloat16)  # one copy, a quarter of what is free
    assert "no AMX" not in caplog.text
    with pytest.raises(ValueError, match="needs --dtype bfloat16"):
        check_dense_copies(weights, torch.float32)
    with pytest.raises(ValueError, match="needs a GGUF file"):
        check_dense_copies({"model.norm.weight": torch.ones(64)}, torch.bfloat16)
    copied = with_dense_copies(weights, torch.bfloat16)
    assert isinstance(copied["model.layers.0.mlp.down_proj.weight"], DualWeight)
    assert type(copied["model.layers.0.mlp.experts.down_proj.weight"]) is QuantizedWeight
    assert copied["model.norm.weight"] is weights["model.norm.weight"]
    monkeypatch.setattr(quantization, "_available_memory", lambda: 3 * 32 * 64 * 2)
    with pytest.raises(ValueError, match="more than a quarter"):
        check_dense_copies(weights, torch.bfloat16)
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AMX - {"amx_bf16"})
    monkeypatch.setattr(quantization, "_available_memory", lambda: 1 << 40)
    check_dense_copies(weights, torch.bfloat16)
    assert "no AMX" in caplog.text


def test_the_flag(make_tiny_engine):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--quantization", "dual"])
    assert engine_config_from_args(args).quantization == "dual"
    with pytest.raises(ValueError, match="needs --dtype bfloat16"):
        make_tiny_engine(quantization="dual")  # float32
    assert resolve_mode("dual", torch.device("cpu")) == "dual"
    with pytest.raises(ValueError, match="dual needs the CPU"):
        resolve_mode("dual", torch.device("cuda"))


@pytest.mark.slow
def test_the_default_model_with_copies_follows_float32(
    default_model_path, make_default_engine, run_engine
):
    """Teacher-forced, as for the blocks alone (`test_quantization`): at each of the float32 run's
    greedy positions the engine with copies gets the same context; prompts of 8+ tokens take the
    bf16 copies, the one-row decode steps the blocks."""
    prompts = [
        make_default_engine().tokenizer.encode(text)
        for text in ("The capital of France is", "def fibonacci(n):\n", "List three colors:\n1.")
    ]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    floats = run_engine(make_default_engine(), prompts, greedy)
    engine = LLMEngine(
        EngineConfig(
            model=str(default_model_path),
            dtype="bfloat16",
            device="cpu",
            quantization="dual",
            plugins=["fcfs"],
            num_kv_blocks=128,
        )
    )
    assert isinstance(engine.runner.model.layers[0].mlp.gate_up, DualLinear)
    assert isinstance(engine.runner.model.lm_head, DualLinear)  # the tied embedding's copy
    agreeing, total = teacher_forced_agreement(engine, prompts, floats)
    print(f"\nblocks + bf16 copies vs float32, teacher-forced: {agreeing} of {total}")
    assert agreeing >= 0.85 * total
