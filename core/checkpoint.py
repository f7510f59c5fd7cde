"""A model loaded on the host (architecture, HF-named weights, tokenizer), and the entry point that loads one."""

from dataclasses import dataclass
from pathlib import Path

import torch

from spyglass.core.model_config import ModelArchConfig
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


def load_checkpoint(model: str | None, dtype: torch.dtype, keep_quantized: bool = False) -> Checkpoint:
    """Load ``model``: None for the default model, a ``.gguf`` file, or a Hugging Face model directory.

    Weights are converted to ``dtype``; with ``keep_quantized`` a GGUF file's quantized matrices
    stay in their blocks (`quantization.QuantizedWeight`). Raises ``ValueError`` for anything else.
    """
    # Imported here because the loaders build Checkpoint objects and so import this module.
    from spyglass.core.default_model import DEFAULT_MODEL_NAME, ensure_default_model
    from spyglass.core.gguf_loader import load_gguf
    from spyglass.core.hf_loader import load_hf_dir

    if model is None:
        checkpoint = load_gguf(ensure_default_model(), dtype, keep_quantized)
        return Checkpoint(DEFAULT_MODEL_NAME, checkpoint.arch, checkpoint.weights, checkpoint.tokenizer)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"GGUF file not found: {model}")
        return load_gguf(path, dtype, keep_quantized)
    if path.is_dir():
        return load_hf_dir(path, dtype)
    raise ValueError(
        f"Cannot load model {model!r}: expected a .gguf file or a local Hugging Face model directory "
        "(with config.json and *.safetensors). Hub model ids are not downloaded; fetch the files first."
    )
