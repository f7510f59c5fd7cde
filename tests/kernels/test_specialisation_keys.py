"""Nothing compiles while serving, checked without a GPU: the Triton kernels run under the
interpreter, each launch's specialisation key (what Triton compiles one variant per: constexpr
values, launch options, argument dtypes, 16-byte pointer alignment, integers equal to 1 or
multiples of 16) is recorded, and a mixed workload after the engine's warm-up meets no key that
the warm-up did not. ``tests/kernels/test_cuda_graphs_gpu.py`` counts real compilations on a GPU."""

import inspect
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import triton.language as tl

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.kernels import triton_attention, triton_norm_rope, triton_store_kv
from tests.kernels.mixed_workload import random_prompts, serve_rounds

KERNELS = {
    "unified": triton_attention._unified_kernel,
    "split_k": triton_attention._split_k_kernel,
    "store_kv": triton_store_kv._store_kv_kernel,
    "add_rms_norm": triton_norm_rope._add_rms_norm_kernel,
    "rotary": triton_norm_rope._rotary_kernel,
}


def _argument_key(value, constexpr: bool, specialised: bool):
    """What Triton's specialisation reads off one argument."""
    if constexpr or value is None or isinstance(value, bool):
        return value
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, int):
        width = "i32" if -(2**31) <= value < 2**31 else "i64"
        return (width, value == 1, value % 16 == 0) if specialised else width
    return type(value).__name__


def _launch_key(kernel, args: tuple, kwargs: dict) -> tuple:
    parameters = inspect.signature(kernel.fn).parameters
    bound = dict(zip(parameters, args)) | kwargs
    unspecialised = set(kernel.kwargs.get("do_not_specialize") or ())
    key = []
    for name, value in sorted(bound.items()):
        constexpr = name in parameters and parameters[name].annotation is tl.constexpr
        key.append(
            (
                name,
                _argument_key(
                    value, constexpr or name not in parameters, name not in unspecialised
                ),
            )
        )
    return tuple(key)


@pytest.fixture
def recorded_keys(monkeypatch):
    """Every kernel launch's specialisation key, per kernel, into the set the test chooses."""
    keys: dict[str, set] = {name: set() for name in KERNELS}
    target = {"keys": keys}
    for name, kernel in KERNELS.items():

        def run(*args, grid, warmup, _name=name, _run=kernel.run, _kernel=kernel, **kwargs):
            target["keys"][_name].add(_launch_key(_kernel, args, kwargs))
            return _run(*args, grid=grid, warmup=warmup, **kwargs)

        monkeypatch.setattr(kernel, "run", run)
    return target


@pytest.mark.timeout(1200)
def test_a_mixed_workload_after_the_warm_up_meets_no_new_specialisation(
    tiny_llama_dir, recorded_keys, monkeypatch
):
    # As on an H200 (132 multiprocessors): small decode batches go through split-K.
    monkeypatch.setattr(triton_attention, "_num_sms", lambda device: 132)
    config = EngineConfig(
        model=str(tiny_llama_dir),
        dtype="float32",
        attention_backend="triton",
        max_num_batched_tokens=64,
        max_num_seqs=8,
        block_size=16,
        num_kv_blocks=96,
        cuda_graphs=False,
        speculative="ngram",
    )
    engine = LLMEngine(config)
    engine.runner.compile_kernels(config.max_num_batched_tokens, engine.max_model_len)
    warm = recorded_keys["keys"]
    served: dict[str, set] = {name: set() for name in KERNELS}
    recorded_keys["keys"] = served
    prompt = random_prompts(1000)
    rounds = [
        [prompt(n) for n in (1, 2, 3, 5, 9, 17, 33, 65)],
        [prompt(300)],  # alone: a long context at batch 1 (split-K)
        [prompt(7) for _ in range(11)],  # more requests than max_num_seqs
        [prompt(3) * 10],  # a repeating prompt: n-gram drafts to verify
    ]
    serve_rounds(engine, rounds, max_tokens=12)
    engine.kv.check_integrity()
    assert all(served[name] for name in ("unified", "split_k", "store_kv", "rotary"))
    new = {name: served[name] - warm[name] for name in KERNELS if served[name] - warm[name]}
    assert new == {}
