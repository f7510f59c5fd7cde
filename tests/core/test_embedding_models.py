"""Base-model checkpoints (no LM head: ``LlamaModel``, ``Qwen2Model``, ``MistralModel``,
``Qwen3Model``, as embedding models ship) load through the real loader and embed as
transformers' ``AutoModel`` does; they refuse generation, naming the model."""

import json

import pytest
import torch

from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams

BASE_MODELS = [
    ("LlamaConfig", "LlamaModel"),
    ("Qwen2Config", "Qwen2Model"),
    ("MistralConfig", "MistralModel"),
    ("Qwen3Config", "Qwen3Model"),
]


@pytest.fixture(scope="module", params=BASE_MODELS, ids=[m for _, m in BASE_MODELS])
def base_model(request, tiny_pooling_model_dir):
    from transformers import AutoModel

    from spyglass.core.llm import LLM

    path = tiny_pooling_model_dir(*request.param)
    assert json.loads((path / "config.json").read_text())["architectures"] == [request.param[1]]
    theirs = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    ours = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    return ours, theirs


def test_vectors_match_transformers(base_model, mixed_texts):
    ours, theirs = base_model
    assert ours.engine.arch.has_lm_head is False
    tokenizer = ours.get_tokenizer()
    token_ids = [tokenizer.encode(text) for text in mixed_texts[:4]]
    outputs = ours.embed(
        [{"prompt_token_ids": t} for t in token_ids], PoolingParams(normalize=False), use_tqdm=False
    )
    for output, ids in zip(outputs, token_ids, strict=True):
        with torch.inference_mode():
            expected = theirs(torch.tensor([ids])).last_hidden_state[0, -1]
        torch.testing.assert_close(
            torch.tensor(output.outputs.embedding), expected, atol=1e-4, rtol=1e-4
        )
    pool = ours.engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks


def test_generation_is_refused_naming_the_model(base_model):
    ours, _ = base_model
    with pytest.raises(InvalidRequestError) as error:
        ours.generate("Hello", SamplingParams(max_tokens=4), use_tqdm=False)
    assert error.value.param == "model"
    assert not ours.engine.has_unfinished_requests


def test_a_base_model_of_an_unsupported_family_is_refused(tmp_path):
    from spyglass.core.loaders.hf_config import hf_family

    with pytest.raises(ValueError, match="for embeddings, LlamaModel"):
        hf_family({"architectures": ["Gemma2Model"]})


@pytest.mark.parametrize(("declared", "asked", "param"), [
    ({"is_matryoshka": True}, [16, 40], None),
    ({"matryoshka_dimensions": [16, 32]}, [16, 32], None),
    ({"matryoshka_dimensions": [16, 32]}, [24], "dimensions"),
    ({"is_matryoshka": True}, [65], "dimensions"),
    ({}, [16], "dimensions"),
])  # fmt: skip
def test_matryoshka_models_cut_their_vectors_and_others_refuse(
    tiny_pooling_model_dir, declared, asked, param
):
    from transformers import AutoModel

    from spyglass.core.llm import LLM

    path = tiny_pooling_model_dir("Qwen3Config", "Qwen3Model", **declared)
    ours = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    ids = ours.get_tokenizer().encode("Foxes live in forests, deserts and cities")
    for dimensions in asked:
        pooling = PoolingParams(dimensions=dimensions)
        if param is not None:
            with pytest.raises(InvalidRequestError) as error:
                ours.embed({"prompt_token_ids": ids}, pooling, use_tqdm=False)
            assert error.value.param == param
            continue
        (output,) = ours.embed({"prompt_token_ids": ids}, pooling, use_tqdm=False)
        theirs = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
        with torch.inference_mode():
            full = theirs(torch.tensor([ids])).last_hidden_state[0, -1]
        expected = torch.nn.functional.normalize(full[:dimensions], dim=-1)
        torch.testing.assert_close(
            torch.tensor(output.outputs.embedding), expected, atol=1e-4, rtol=0
        )
