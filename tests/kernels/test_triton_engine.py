"""The whole engine through the Triton kernels (under the interpreter on CPU) gives the torch path's tokens."""

import os
from collections.abc import Callable

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams

PROMPT_LENGTHS = (5, 23, 40)


def _greedy_tokens(
    model_dir, backend: str, warm_up: bool = False, graphs: Callable | None = None
) -> dict[str, list[int]]:
    # A small token budget forces chunked prefill mixed with decodes: every attention shape is exercised.
    config = EngineConfig(
        model=str(model_dir),
        dtype="float32",
        attention_backend=backend,
        max_num_batched_tokens=24,
        max_num_seqs=8,
        block_size=16,
        num_kv_blocks=64,
        cuda_graphs=False,
    )
    engine = LLMEngine(config)
    assert engine.backend.name == backend
    if warm_up:  # as the engine does on CUDA
        engine.runner.compile_kernels(config.max_num_batched_tokens, engine.max_model_len)
    if graphs is not None:
        graphs(engine)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for index, length in enumerate(PROMPT_LENGTHS):
        engine.add_request(
            str(index), [(7 * index + 11 * t) % 1000 + 100 for t in range(length)], params
        )
    tokens = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids
    engine.kv.check_integrity()
    return tokens


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_triton_path_matches_torch_path(family, tiny_llama_dir, tiny_family_dir):
    # Gemma 2 adds a 16-token sliding window on alternate layers and soft-capped scores.
    model_dir = tiny_llama_dir if family == "llama" else tiny_family_dir(family)
    assert _greedy_tokens(model_dir, "triton") == _greedy_tokens(model_dir, "torch")


@pytest.mark.timeout(900)
def test_packed_graphs_through_the_triton_kernels_give_the_eager_tokens(
    tiny_llama_dir, eager_graphs
):
    # Prompt chunks among decodes replayed as packed graphs hold them (the step's rows, padding
    # rows, requests with no query): the attention's packed grid skips what is not the step's.
    installed = []

    def install(engine):
        installed.append(eager_graphs(engine, token_buckets=(16, 24)))

    tokens = _greedy_tokens(tiny_llama_dir, "triton", graphs=install)
    assert tokens == _greedy_tokens(tiny_llama_dir, "torch")
    assert any(shape.rows == 0 for shape in installed[0].replayed)


@pytest.mark.timeout(900)
def test_warm_up_steps_reach_every_tile_height_and_change_no_result(tiny_llama_dir, monkeypatch):
    from spyglass.kernels import triton_attention

    query_lengths = []
    unified = triton_attention.unified_attention

    def recording(*args, **kwargs):
        query_lengths.append(args[6])  # max_query_len
        return unified(*args, **kwargs)

    monkeypatch.setattr(triton_attention, "unified_attention", recording)
    warmed = _greedy_tokens(tiny_llama_dir, "triton", warm_up=True)
    heights, _ = triton_attention.warm_up_shapes()
    # Every tile height and the token budget (24) were run: 32 and 64 only by the warm-up, whose
    # steps leave no trace in what the requests get.
    assert {*heights, 24} <= set(query_lengths)
    assert warmed == _greedy_tokens(tiny_llama_dir, "torch")
