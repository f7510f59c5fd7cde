"""``--kv-cache-dtype float16``: a float32 model on the CPU keeps its keys and values in half the bytes.

Rounding K and V to float16 (about 3 significant digits) is not exact, so the default model's
greedy output is compared with the float32 cache's: the test prints how many tokens agree before
any difference and requires nearly all.
"""

import argparse

import pytest
import torch

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.sampling_params import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "你好，请介绍一下你自己。",
    "Once upon a time, there was a little robot named",
    "List three primary colors:\n1.",
    '{"name": "Alice", "age": 30, "languages": ["English", "French"], "address": {"city":',
]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_a_float16_cache_has_twice_the_blocks_of_a_float32_one_in_the_same_memory(
    make_tiny_engine,
):
    budget = 4 << 20
    full = make_tiny_engine(num_kv_blocks=None, kv_cache_memory=budget)
    half = make_tiny_engine(num_kv_blocks=None, kv_cache_memory=budget, kv_cache_dtype="float16")
    assert half.info.num_kv_blocks == 2 * full.info.num_kv_blocks
    assert (full.info.dtype, full.info.kv_cache_dtype) == ("float32", "float32")
    assert (half.info.dtype, half.info.kv_cache_dtype) == ("float32", "float16")
    for k_cache, v_cache in half.runner.kv_caches:
        assert k_cache.dtype == v_cache.dtype == torch.float16


def test_a_float16_cache_is_for_float32_models_on_the_cpu():
    config = EngineConfig(kv_cache_dtype="float16")
    cpu = torch.device("cpu")
    assert config.kv_cache_torch_dtype(torch.float32, cpu) == torch.float16
    assert EngineConfig().kv_cache_torch_dtype(torch.bfloat16, cpu) == torch.bfloat16
    with pytest.raises(
        ValueError, match="--kv-cache-dtype float16 is for float32 models on the CPU"
    ):
        config.kv_cache_torch_dtype(torch.bfloat16, cpu)
    with pytest.raises(ValueError, match="runs float32 on cuda"):
        config.kv_cache_torch_dtype(torch.float32, torch.device("cuda"))
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="fp8")


def test_the_cli_flag_reaches_the_engine_config():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args([])).kv_cache_dtype == "auto"
    args = parser.parse_args(["--kv-cache-dtype", "float16"])
    assert engine_config_from_args(args).kv_cache_dtype == "float16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int8"])


@pytest.mark.slow
def test_default_model_with_a_float16_cache_agrees_with_float32(make_default_engine, run_engine):
    # run_engine checks the KV bookkeeping every step and that every block is free at the end.
    engine = make_default_engine()
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    want = run_engine(engine, prompts, GREEDY)
    got = run_engine(make_default_engine(kv_cache_dtype="float16"), prompts, GREEDY)
    agreeing = 0  # tokens equal up to each prompt's first difference
    for a, b in zip(want, got, strict=True):
        pairs = zip(a.outputs[0].token_ids, b.outputs[0].token_ids, strict=True)
        agreeing += next((i for i, (x, y) in enumerate(pairs) if x != y), 32)
    total = 32 * len(PROMPTS)
    print(
        f"\nfloat16 vs float32 KV cache greedy: {agreeing} of {total} tokens agree before any difference"
    )
    assert agreeing >= 0.9 * total
