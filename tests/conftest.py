"""Shared fixtures: the real default model, and tiny random HF model directories that reuse its tokenizer."""

from pathlib import Path

import pytest
import torch

from spyglass.core.checkpoint import Checkpoint
from spyglass.core.default_model import ensure_default_model
from spyglass.core.gguf_loader import load_gguf

# Small enough to build and save in well under a second, with GQA (4 query heads share 2 kv heads).
TINY_SHAPE = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's GGUF file (downloaded into the user cache on first use)."""
    return ensure_default_model()


@pytest.fixture(scope="session")
def default_checkpoint(default_model_path) -> Checkpoint:
    """The default model loaded in float32 (shared: each load takes seconds)."""
    return load_gguf(default_model_path, torch.float32)


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(default_model_path):
    """transformers' own tokenizer for the default GGUF: the reference our tokenizer must match."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path.parent, gguf_file=default_model_path.name)


def _save_tiny(model, tokenizer, path: Path, **save_kwargs) -> Path:
    model.save_pretrained(path, **save_kwargs)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, hf_gguf_tokenizer) -> Path:
    """A random 2-layer LlamaForCausalLM (untied, llama3 rope scaling) saved with the default model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **TINY_SHAPE,
        vocab_size=len(hf_gguf_tokenizer),
        max_position_embeddings=16384,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    return _save_tiny(LlamaForCausalLM(config), hf_gguf_tokenizer, tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, hf_gguf_tokenizer) -> Path:
    """A random 2-layer Qwen2ForCausalLM (q/k/v biases, tied embeddings, two eos ids), saved in several shards."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    config = Qwen2Config(
        **TINY_SHAPE, vocab_size=len(hf_gguf_tokenizer), tie_word_embeddings=True, eos_token_id=[2, 0]
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        # transformers initializes biases to zero, which would make a bias mix-up invisible.
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_()
    return _save_tiny(model, hf_gguf_tokenizer, tmp_path_factory.mktemp("tiny_qwen2"), max_shard_size="5MB")
