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


# Family -> (transformers config class, model class, config options beyond TINY_SHAPE). Every
# option below is one the family's real checkpoints use, shrunk: a 16-token sliding window (the
# test prompts run past it), rope scalings, soft-caps small enough to bite on random weights.
_WINDOW = 16
TINY_FAMILIES = {
    "qwen2-yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        head_dim=16, rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 2.0,
                                      "original_max_position_embeddings": 128})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=_WINDOW)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        pad_token_id=0, max_position_embeddings=1024, original_max_position_embeddings=256,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0 + i / 8 for i in range(8)], "long_factor": [2.0 + i for i in range(8)]})),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=16, sliding_window=_WINDOW, query_pre_attn_scalar=16, attn_logit_softcapping=1.0,
        final_logit_softcapping=2.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, sliding_window=_WINDOW, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        mlp_only_layers=[1])),
}


@pytest.fixture(scope="session")
def tiny_family_dir(tmp_path_factory, hf_gguf_tokenizer):
    """``make(family)``: a random 2-layer checkpoint of a `TINY_FAMILIES` family, built once and saved with
    the default model's tokenizer. Weights are drawn wider than transformers' init (std 0.1, biases
    too) so attention is peaked enough for masks, windows and caps to show in the logits."""
    import transformers

    built: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in built:
            config_class, model_class, options = TINY_FAMILIES[family]
            # Seeded by family, so every test selection builds the same weights.
            torch.manual_seed(10 + list(TINY_FAMILIES).index(family))
            config = getattr(transformers, config_class)(
                **TINY_SHAPE, vocab_size=len(hf_gguf_tokenizer), **options, bos_token_id=1, eos_token_id=2
            )
            model = getattr(transformers, model_class)(config)
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if not name.endswith("norm.weight"):
                        param.normal_(std=0.1)
            built[family] = _save_tiny(model, hf_gguf_tokenizer, tmp_path_factory.mktemp(f"tiny_{family}"))
        return built[family]

    return make
