"""Load a Hugging Face model directory (config.json + *.safetensors) of a supported family into a Checkpoint."""

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from spyglass.core.loaders import (
    gemma3_config,
    idefics3_config,
    llava_config,
    mistral3_config,
    qwen2_vl_config,
)
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.hf_config import hf_family, read_arch
from spyglass.core.loaders.pooling_config import sentence_transformers_pooling
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.registry import model_weight_names
from spyglass.core.tokenizer import Tokenizer


def load_hf_dir(path: str | Path, dtype: torch.dtype) -> Checkpoint:
    """Load a model directory of any family in `core.models.registry`, converting weights to ``dtype``.

    Reads config.json (`hf_config.read_arch`; a vision model's language model and vision tower,
    `llava_config`, `idefics3_config`, `qwen2_vl_config`, `gemma3_config`, `mistral3_config`),
    every safetensors shard, and the tokenizer.
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory: it has no config.json")
    outer = config = json.loads(config_file.read_text())
    vision = None
    if llava_config.is_llava(config):
        vision, config = llava_config.vision_config(config, path), llava_config.text_config(config)
    elif idefics3_config.is_idefics3(config):
        idefics3_config.check_vision(config, path)
        config = idefics3_config.text_config(config)
    elif qwen2_vl_config.is_qwen2_vl(config):
        qwen2_vl_config.vision_config(config, path)
        config = qwen2_vl_config.text_config(config)
    elif gemma3_config.is_gemma3_vision(config):
        config = gemma3_config.text_config(config)
    elif mistral3_config.is_mistral3(config):
        config = mistral3_config.text_config(config)
    hf_family(config)  # an unsupported class fails here, before the tokenizer and weights are read
    tokenizer = Tokenizer.from_hf_dir(path)
    if qwen2_vl_config.is_qwen2_vl(outer):
        vision = qwen2_vl_config.vision_config(outer, path, tokenizer)
    elif idefics3_config.is_idefics3(outer):
        vision = idefics3_config.vision_config(outer, path, tokenizer)
    elif gemma3_config.is_gemma3_vision(outer):
        vision = gemma3_config.vision_config(outer, path, tokenizer)
    elif mistral3_config.is_mistral3(outer):
        vision = mistral3_config.vision_config(outer, path, tokenizer)
    arch = dataclasses.replace(read_arch(config, tokenizer.eos_token_ids), vision=vision)
    pooling_type = sentence_transformers_pooling(path)
    if pooling_type is not None:
        arch = dataclasses.replace(arch, pooling_type=pooling_type)
    weights = _read_weights(path, arch, dtype)
    return Checkpoint(path.name, arch, weights, tokenizer)


def check_supported(path: str | Path) -> None:
    """Raise ValueError, naming the supported model classes, when the HF directory ``path`` holds a model
    class no family here loads. Reads config.json only; anything that is not an HF directory passes."""
    path = Path(path).expanduser()
    config_file = path / "config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        if llava_config.is_llava(config):
            llava_config.vision_config(config, path)
            config = llava_config.text_config(config)
        elif idefics3_config.is_idefics3(config):
            idefics3_config.check_vision(config, path)
            config = idefics3_config.text_config(config)
        elif qwen2_vl_config.is_qwen2_vl(config):
            qwen2_vl_config.vision_config(config, path)
            config = qwen2_vl_config.text_config(config)
        elif gemma3_config.is_gemma3_vision(config):
            config = gemma3_config.text_config(config)
        elif mistral3_config.is_mistral3(config):
            config = mistral3_config.text_config(config)
        hf_family(config)


# Which loader names each tower's checkpoints' parameters.
_NAMING = {
    "clip": llava_config,
    "siglip": llava_config,
    "idefics3": idefics3_config,
    "qwen2_vl": qwen2_vl_config,
    "qwen2_5_vl": qwen2_vl_config,
    "qwen3_vl": qwen2_vl_config,
    "gemma3": llava_config,
    "pixtral": llava_config,
}


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        # The index names exactly the shards in use; other .safetensors files may sit alongside.
        return [
            path / name
            for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))
        ]
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ValueError(
            f"{path} has no *.safetensors weights (PyTorch .bin checkpoints are not supported)."
        )
    return shards


def _read_weights(path: Path, arch: ModelArchConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    weights = {}
    # A progress bar on a terminal only (the conversion runs once per model; later starts use the cache).
    for shard in tqdm(
        _shard_files(path), desc=f"converting {path.name}", unit="shard", disable=None
    ):
        weights.update((name, tensor.to(dtype)) for name, tensor in load_file(shard).items())
    if arch.vision is not None:
        weights = _NAMING[arch.vision.tower].canonical_names(weights)
    if not arch.has_lm_head and not arch.num_labels:
        # A base model's checkpoint names its parameters without the causal LM's "model." prefix.
        weights = {
            name if name.startswith("model.") else f"model.{name}": w for name, w in weights.items()
        }
    if arch.tie_word_embeddings:
        # Tied models may still store a copy of the embedding as lm_head; the model reuses the embedding.
        weights.pop("lm_head.weight", None)
    # Old checkpoints saved the rotary cache as a buffer; it is recomputed from rope_theta.
    weights = {name: w for name, w in weights.items() if not name.endswith("rotary_emb.inv_freq")}
    expected = model_weight_names(arch)
    missing, unexpected = expected - weights.keys(), weights.keys() - expected
    if missing or unexpected:
        raise ValueError(
            f"Weights in {path} do not match config.json: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}."
        )
    return weights
