"""Load a Hugging Face model directory (config.json + *.safetensors) of a Llama or Qwen2 model into a Checkpoint."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from spyglass.core.checkpoint import Checkpoint
from spyglass.core.model_config import ModelArchConfig
from spyglass.core.tokenizer import Tokenizer

# HF class -> (our architecture, defaults of that class's config for keys a config.json may omit).
_ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", {"max_position_embeddings": 2048, "attention_bias": False}),
    "Qwen2ForCausalLM": ("qwen2", {"max_position_embeddings": 32768, "attention_bias": True}),
}


def load_hf_dir(path: str | Path, dtype: torch.dtype) -> Checkpoint:
    """Load a Llama/Qwen2 model directory, converting weights to ``dtype``.

    Reads config.json (both the transformers 4 ``rope_theta``/``rope_scaling`` and the
    transformers 5 ``rope_parameters`` spellings), every safetensors shard, and the tokenizer.
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory: it has no config.json")
    tokenizer = Tokenizer.from_hf_dir(path)
    arch = _read_arch(json.loads(config_file.read_text()), tokenizer.eos_token_ids)
    weights = _read_weights(path, arch, dtype)
    return Checkpoint(path.name, arch, weights, tokenizer)


def _read_arch(config: dict, eos_token_ids: tuple[int, ...]) -> ModelArchConfig:
    class_name = (config.get("architectures") or [None])[0]
    if class_name not in _ARCHITECTURES:
        raise ValueError(f"Unsupported model class {class_name!r}; supported: {', '.join(_ARCHITECTURES)}.")
    architecture, defaults = _ARCHITECTURES[class_name]
    if config.get("hidden_act", "silu") != "silu" or config.get("mlp_bias") or config.get("use_sliding_window"):
        raise ValueError(f"Unsupported {class_name} variant: needs silu MLP without bias and no sliding window.")

    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_theta = rope.pop("rope_theta", config.get("rope_theta", 10000.0))
    # Older configs call the key "type"; "default" means no scaling at all.
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    rope_scaling = None if rope_type == "default" else {"rope_type": rope_type, **rope}

    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    return ModelArchConfig(
        architecture=architecture,
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        max_position_embeddings=config.get("max_position_embeddings", defaults["max_position_embeddings"]),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        attention_bias=config.get("attention_bias", defaults["attention_bias"]),
        rope_scaling=rope_scaling,
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_token_ids,
    )


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        # The index names exactly the shards in use; other .safetensors files may sit alongside.
        return [path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{path} has no *.safetensors weights (PyTorch .bin checkpoints are not supported).")
    return shards


def _read_weights(path: Path, arch: ModelArchConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    weights = {}
    # A progress bar on a terminal only (the conversion runs once per model; later starts use the cache).
    for shard in tqdm(_shard_files(path), desc=f"converting {path.name}", unit="shard", disable=None):
        weights.update((name, tensor.to(dtype)) for name, tensor in load_file(shard).items())
    if arch.tie_word_embeddings:
        # Tied models may still store a copy of the embedding as lm_head; the model reuses the embedding.
        weights.pop("lm_head.weight", None)
    # Old checkpoints saved the rotary cache as a buffer; it is recomputed from rope_theta.
    weights = {name: w for name, w in weights.items() if not name.endswith("rotary_emb.inv_freq")}
    expected = _expected_names(arch)
    missing, unexpected = expected - weights.keys(), weights.keys() - expected
    if missing or unexpected:
        raise ValueError(
            f"Weights in {path} do not match config.json: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}."
        )
    return weights


def _expected_names(arch: ModelArchConfig) -> set[str]:
    per_layer = [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"self_attn.{p}_proj.bias" for p in "qkv" if arch.attention_bias),
    ]
    names = {f"model.layers.{i}.{n}" for i in range(arch.num_hidden_layers) for n in per_layer}
    names |= {"model.embed_tokens.weight", "model.norm.weight"}
    if not arch.tie_word_embeddings:
        names.add("lm_head.weight")
    return names
