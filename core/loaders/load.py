"""The one entry point that loads a model, whatever its source: the default model, a GGUF file, an HF directory."""

import dataclasses
from pathlib import Path

import torch

from spyglass.core.loaders import weight_cache
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.default_model import DEFAULT_MODEL_NAME, cache_dir, ensure_default_model
from spyglass.core.loaders.gguf_loader import load_gguf
from spyglass.core.loaders.hf_loader import load_hf_dir


def load_checkpoint(
    model: str | None, dtype: torch.dtype, keep_quantized: bool = False
) -> Checkpoint:
    """Load ``model``: None for the default model, a ``.gguf`` file, or a Hugging Face model directory.

    Weights are converted to ``dtype``; with ``keep_quantized`` a GGUF file's quantized matrices
    stay in their blocks (`quantization.QuantizedWeight`). A converted checkpoint is cached on disk
    and memory-mapped by the next load of the same files (`weight_cache`). Raises ``ValueError``
    for anything else.
    """
    if model is None:
        source = ensure_default_model()
        convert = lambda: load_gguf(source, dtype, keep_quantized)
    else:
        source = Path(model).expanduser()
        if source.suffix == ".gguf":
            if not source.is_file():
                raise ValueError(f"GGUF file not found: {model}")
            convert = lambda: load_gguf(source, dtype, keep_quantized)
        elif source.is_dir():
            convert = lambda: load_hf_dir(source, dtype)
        else:
            raise ValueError(
                f"Cannot load model {model!r}: expected a .gguf file or a local Hugging Face model directory "
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
        if model is None
        else source.stem
        if source.suffix == ".gguf"
        else source.name
    )
    return dataclasses.replace(checkpoint, name=name)
