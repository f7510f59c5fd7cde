"""A model loaded on the host: architecture, HF-named weights, tokenizer."""

from dataclasses import dataclass

import torch

from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Everything needed to build a model, whatever file format it came from.

    ``weights`` uses Hugging Face parameter names (``model.layers.0.self_attn.q_proj.weight``, ...);
    ``lm_head.weight`` is present only when ``arch.tie_word_embeddings`` is false. Matrices may be
    `quantization.QuantizedWeight` (blocks multiplied by the CPU kernels) instead of tensors.
    """

    name: str
    arch: ModelArchConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
