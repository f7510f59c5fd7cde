"""A model loaded on the host (architecture, HF-named weights, tokenizer), and the entry point that loads one."""

import dataclasses
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
    stay in their blocks (`quantization.QuantizedWeight`). A converted checkpoint is cached on disk
    and memory-mapped by the next load of the same files (`weight_cache`). Raises ``ValueError``
    for anything else.
    """
    # Imported here because the loaders and the cache build Checkpoint objects and so import this module.
    from spyglass.core import weight_cache
    from spyglass.core.default_model import DEFAULT_MODEL_NAME, cache_dir, ensure_default_model
    from spyglass.core.gguf_loader import load_gguf
    from spyglass.core.hf_loader import load_hf_dir

    if model is None:
        source = ensure_default_model()
        convert = lambda: load_gguf(source, dtype, keep_quantized)  # noqa: E731
    else:
        source = Path(model).expanduser()
        if source.suffix == ".gguf":
            if not source.is_file():
                raise ValueError(f"GGUF file not found: {model}")
            convert = lambda: load_gguf(source, dtype, keep_quantized)  # noqa: E731
        elif source.is_dir():
            convert = lambda: load_hf_dir(source, dtype)  # noqa: E731
        else:
            raise ValueError(
                f"Cannot load model {model!r}: expected a .gguf file or a local Hugging Face model directory "
                "(with config.json and *.safetensors). Hub model ids are not downloaded; fetch the files first."
            )
    checkpoint = convert() if not weight_cache.enabled() else weight_cache.cached_checkpoint(
        cache_dir(), source, f"{dtype}|keep_quantized={keep_quantized and source.suffix == '.gguf'}", convert
    )
    # Named here, not by the cache: the same file is the default model or a path the user gave.
    name = DEFAULT_MODEL_NAME if model is None else source.stem if source.suffix == ".gguf" else source.name
    return dataclasses.replace(checkpoint, name=name)
