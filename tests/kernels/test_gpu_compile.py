"""Every Triton kernel variant the engine warms up compiles for the A100 (sm_80), the L4 and other
Ada cards (sm_89) and the H100/H200 (sm_90), checked without a GPU.

The interpreter runs the kernels here, but it accepts what the compiler may refuse (types that
drift through a loop, shapes `tl.dot` cannot take, constructs it does not lower), and a kernel that
does not compile fails every step on a GPU. So the warm-up's launches (which between them reach
every variant: `tests/kernels/test_specialisation_keys.py`) are recorded under the interpreter, in
bfloat16 as a GPU serves, and each variant is compiled to a cubin for each of those by Triton's
own compiler and ptxas, in a process of its own without the interpreter, and must fit in that
GPU's shared memory per program (which the interpreter does not have)."""

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.kernels import triton_attention

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the kernels compile for real (-m gpu)"
)

_POINTEE = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}
# The interpreter multiplies bf16 as integers, so under it the attention kernels take fp32 operands
# (`triton_attention._dot_in_fp32`); a GPU takes them in bf16.
_GPU_CONSTEXPRS = {"DOT_FP32": False}

_COMPILE = """
import importlib, json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

failures = []
for variant in json.load(sys.stdin):
    kernel = getattr(importlib.import_module(variant["module"]), variant["name"])
    source = ASTSource(
        fn=kernel,
        signature=variant["signature"],
        constexprs={(index,): value for index, value in variant["constexprs"]},
    )
    for capability, shared in SHARED_MEMORY.items():
        name = f"sm_{capability} {variant['name']} {variant['constexprs']}"
        try:
            target = GPUTarget("cuda", capability, 32)
            compiled = triton.compile(source, target=target, options=variant["options"])
        except Exception as error:
            failures.append(f"{name}: {type(error).__name__}: {error}")
            continue
        if compiled.metadata.shared > shared:
            failures.append(f"{name}: {compiled.metadata.shared} B shared, of {shared}")
print(json.dumps(failures))
"""
# What a program may hold in shared memory (opted in), by compute capability: Triton refuses to
# launch a kernel that needs more, so such a variant would fail on that GPU only.
_SHARED_MEMORY = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}


def _argument_type(value) -> str:
    """Triton's signature type of a runtime argument."""
    if isinstance(value, torch.Tensor):
        return "*" + _POINTEE[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {value!r}")


def _variant(kernel, args: tuple, kwargs: dict) -> dict:
    """One launch as what Triton compiles: the signature, the constexprs (by position) and the
    launch options."""
    parameters = list(inspect.signature(kernel.fn).parameters.values())
    bound = dict(zip((p.name for p in parameters), args)) | kwargs
    signature, constexprs = {}, []
    for index, parameter in enumerate(parameters):
        value = bound[parameter.name]
        if parameter.annotation is tl.constexpr or value is None:
            signature[parameter.name] = "constexpr"
            constexprs.append((index, _GPU_CONSTEXPRS.get(parameter.name, value)))
        else:
            signature[parameter.name] = _argument_type(value)
    options = {name: kwargs[name] for name in ("num_warps", "num_stages") if name in kwargs}
    return {
        "module": kernel.fn.__module__,
        "name": kernel.fn.__name__,
        "signature": signature,
        "constexprs": constexprs,
        "options": options,
    }


@pytest.fixture
def warmed_up_variants(monkeypatch):
    """``warm(model_dir)``: the distinct kernel variants of an engine's warm-up (bf16, Triton)."""
    variants: dict[str, dict] = {}
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        variant = _variant(self, args, kwargs)
        variants[json.dumps(variant, sort_keys=True)] = variant
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    # As on an H200 (132 multiprocessors): the warm-up's long decode goes through split-K.
    monkeypatch.setattr(triton_attention, "_num_sms", lambda device: 132)

    def warm(model_dir) -> list[dict]:
        config = EngineConfig(
            model=str(model_dir),
            dtype="bfloat16",
            attention_backend="triton",
            max_num_batched_tokens=64,
            max_num_seqs=4,
            num_kv_blocks=64,
            cuda_graphs=False,
        )
        engine = LLMEngine(config)
        engine.runner.compile_kernels(config.max_num_batched_tokens, engine.max_model_len)
        engine.shutdown()
        return list(variants.values())

    return warm


def _compile_for_gpus(variants: list[dict]) -> list[str]:
    """Compile each variant for each GPU of `_SHARED_MEMORY` in a process without the
    interpreter; the failures."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", f"SHARED_MEMORY = {_SHARED_MEMORY}\n{_COMPILE}"],
        input=json.dumps(variants),
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.timeout(1200)
def test_every_warmed_up_variant_compiles_for_the_gpus(
    tiny_llama_dir, tiny_family_dir, warmed_up_variants
):
    # A Llama (attention of every query height, split-K, norms, rope, KV stores) and a Gemma 2
    # (sliding window and soft-capping) and a Qwen3 MoE (the expert kernels) between them.
    for model_dir in (tiny_llama_dir, tiny_family_dir("gemma2"), tiny_family_dir("qwen3-moe")):
        variants = warmed_up_variants(model_dir)
    names = {variant["name"] for variant in variants}
    assert {"_unified_kernel", "_split_k_kernel", "_store_kv_kernel", "_rotary_kernel"} <= names
    assert _compile_for_gpus(variants) == []
