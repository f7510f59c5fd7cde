"""A random LLaVA checkpoint: a CLIP tower of the given shape before the default model's language
model shape (SmolLM2-135M's), with the default model's tokenizer plus an ``<image>`` token. What
``bench vision`` runs when no vision model is at hand (speed does not depend on the values)."""

from dataclasses import dataclass
from pathlib import Path

import torch

from spyglass.core.loaders.default_model import ensure_default_model
from spyglass.core.loaders.gguf_loader import load_gguf

IMAGE_TOKEN = "<image>"


@dataclass(frozen=True, slots=True)
class TowerShape:
    """A CLIP vision tower's shape (the defaults: ViT-B/16 at 224 pixels, 196 image tokens)."""

    image_size: int = 224
    patch_size: int = 16
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12


def write_random_llava(path: Path, tower: TowerShape, text_layers: int | None, seed: int) -> Path:
    """Save a random ``LlavaForConditionalGeneration`` (float32) and its tokenizer at ``path``;
    ``text_layers`` cuts the language model's depth (None: the default model's)."""
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    source = ensure_default_model()
    arch = load_gguf(source, torch.float32).arch
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=text_layers or arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        rms_norm_eps=arch.rms_norm_eps,
        rope_theta=arch.rope_theta,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        bos_token_id=arch.bos_token_id,
        eos_token_id=list(arch.eos_token_ids),
    )
    vision = CLIPVisionConfig(
        hidden_size=tower.hidden_size,
        intermediate_size=4 * tower.hidden_size,
        num_hidden_layers=tower.num_layers,
        num_attention_heads=tower.num_heads,
        image_size=tower.image_size,
        patch_size=tower.patch_size,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=len(tokenizer) - 1,
        image_seq_length=(tower.image_size // tower.patch_size) ** 2,
    )
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    CLIPImageProcessorPil(
        size={"shortest_edge": tower.image_size}, crop_size=tower.image_size
    ).save_pretrained(path)
    return path
