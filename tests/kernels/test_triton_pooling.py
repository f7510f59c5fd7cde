"""Pooling requests through the Triton kernels (under the interpreter on CPU) give the torch
path's vectors, beside generation and across chunks; on a GPU, CUDA (graphs captured, pooled
steps run eagerly) gives the CPU's."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import SamplingParams, pooling_request_params

PROMPT_LENGTHS = (5, 23, 40)


def _pooled(model_dir, backend: str, pooling_type: str, device: str = "cpu") -> dict:
    """Each prompt's raw pooled vector, and a generated answer beside them, on one engine."""
    # A small token budget splits the longer prompts into chunks, beside a decoding request.
    config = EngineConfig(
        model=str(model_dir),
        dtype="float32",
        device=device,
        attention_backend=backend,
        max_num_batched_tokens=24,
        num_kv_blocks=64,
        cuda_graphs=device == "cuda",
        pooling_type=pooling_type,
    )
    engine = LLMEngine(config)
    raw = pooling_request_params(PoolingParams(normalize=False))
    for index, length in enumerate(PROMPT_LENGTHS):
        prompt = [(7 * index + 11 * t) % 1000 + 100 for t in range(length)]
        engine.add_request(str(index), prompt, raw)
    generate = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("generated", list(range(100, 120)), generate)
    answers = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                answers[output.request_id] = output.pooled or output.outputs[0].token_ids
    engine.kv.check_integrity()
    engine.shutdown()
    return answers


def _assert_same(actual: dict, expected: dict) -> None:
    assert actual["generated"] == expected["generated"]
    for index in range(len(PROMPT_LENGTHS)):
        torch.testing.assert_close(
            torch.tensor(actual[str(index)]), torch.tensor(expected[str(index)]), atol=1e-4, rtol=0
        )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pooling_type", ["last", "mean"])
def test_triton_path_pools_as_the_torch_path_does(tiny_llama_dir, pooling_type):
    _assert_same(
        _pooled(tiny_llama_dir, "triton", pooling_type),
        _pooled(tiny_llama_dir, "torch", pooling_type),
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pooling_type", ["last", "mean", "cls"])
def test_cuda_pools_as_the_cpu_does(tiny_llama_dir, pooling_type):
    _assert_same(
        _pooled(tiny_llama_dir, "auto", pooling_type, device="cuda"),
        _pooled(tiny_llama_dir, "torch", pooling_type),
    )
