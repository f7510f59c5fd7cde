"""The one entry point that loads a model, whatever its source: the default model, a GGUF file, an HF directory."""

import dataclasses
from pathlib import Path

import torch

from spyglass.core.loaders import weight_cache
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.default_model import (
    DEFAULT_MODEL_ENV,
    DEFAULT_MODEL_NAME,
    cache_dir,
    default_model_override,
    ensure_default_model,
)
from spyglass.core.loaders.gguf_loader import load_gguf
from spyglass.core.loaders.hf_loader import load_hf_dir


def load_checkpoint(
    model: str | None, dtype: torch.dtype, keep_quantized: bool = False
) -> Checkpoint:
    """Load ``model``: None for the default model (or the one ``$SPYGLASS_DEFAULT_MODEL`` names), a
    ``.gguf`` file, or a Hugging Face model directory.

    Weights are converted to ``dtype``; with ``keep_quantized`` a GGUF file's quantized matrices
    stay in their blocks (`quantization.QuantizedWeight`). A converted checkpoint is cached on disk
    and memory-mapped by the next load of the same files (`weight_cache`). Raises ``ValueError``
    for anything else.
    """
    override = default_model_override() if model is None else None
    if model is None and override is None:
        source = ensure_default_model()
        convert = lambda: load_gguf(source, dtype, keep_quantized)
    else:
        source = Path(model).expanduser() if model is not None else override
        shown = model if model is not None else f"{override} (${DEFAULT_MODEL_ENV})"
        if source.suffix == ".gguf":
            if not source.is_file():
                raise ValueError(f"GGUF file not found: {shown}")
            convert = lambda: load_gguf(source, dtype, keep_quantized)
        elif source.is_dir():
            convert = lambda: load_hf_dir(source, dtype)
        else:
            raise ValueError(
                f"Cannot load model {shown!r}: expected a .gguf file or a local Hugging Face model directory "
                "(with config.json and *.safetensors). Hub model ids are not downloaded; fetch the files first."
            )
    checkpoint = (
        convert()
        if not weight_cache.enabled()
        else weight_cache.cached_checkpoint(
            cache_dir(),
            source,
            f"{dtype}|keep_quantized={keep_quantized and source.suffix == '.gguf'}",
            convert,
        )
    )
    # Named here, not by the cache: the same file is the default model or a path the user gave.
    name = (
        DEFAULT_MODEL_NAME
        if model is None and override is None
        else source.stem
        if source.suffix == ".gguf"
        else source.name
    )
    return dataclasses.replace(checkpoint, name=name)
