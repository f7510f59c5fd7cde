"""``examples/gpu_model``: the default model's shape with random weights, from the configs and tokenizer the repo ships.

What a GPU machine without network runs instead of the default model (``examples/gpu_check.py``):
it must load in Spyglass and in transformers alike, with the default model's architecture and
tokenizer, and give the same greedy tokens in both.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams

_BUILDER = Path(__file__).parents[2] / "examples" / "gpu_model" / "random_model.py"


@pytest.fixture(scope="module")
def random_default_shape(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("random_model", _BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build("default", tmp_path_factory.mktemp("smollm2_shape"), dtype=torch.float32)


@pytest.mark.slow
def test_the_random_default_shape_is_the_default_models_shape_and_tokenizer(
    random_default_shape, default_checkpoint, tmp_path, monkeypatch
):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPYGLASS_DEFAULT_MODEL", str(random_default_shape))
    engine = LLMEngine(EngineConfig(dtype="float32", num_kv_blocks=64))
    real = default_checkpoint.arch
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
                  "rope_theta", "intermediate_size"):  # fmt: skip
        assert getattr(engine.arch, field) == getattr(real, field), field
    text = default_checkpoint.tokenizer.apply_chat_template([{"role": "user", "content": "Hi ✓"}])
    assert engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi ✓"}]) == text
    prompt = default_checkpoint.tokenizer.encode(text)
    assert engine.tokenizer.encode(text) == prompt

    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    tokens = []
    while engine.has_unfinished_requests:
        for output in engine.step():
            tokens = output.outputs[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained(random_default_shape, dtype=torch.float32)
    with torch.inference_mode():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    assert tokens == want[0, len(prompt) :].tolist()
