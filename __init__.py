"""Spyglass: an observability-first LLM serving engine.

``LLM``, ``SamplingParams`` (and ``StructuredOutputsParams``), ``PoolingParams``,
``BeamSearchParams``, ``LoRARequest`` and the output classes are imported on first use, so
that the ``spyglass`` command answers ``--help`` without loading torch.
"""

import importlib

_EXPORTS = {
    "LLM": "spyglass.core.llm",
    "SamplingParams": "spyglass.core.engine.sampling_params",
    "RequestOutputKind": "spyglass.core.engine.sampling_params",
    "StructuredOutputsParams": "spyglass.core.engine.sampling_params",
    "RequestOutput": "spyglass.core.engine.outputs",
    "CompletionOutput": "spyglass.core.engine.outputs",
    "PoolingParams": "spyglass.core.engine.pooling_params",
    "EmbeddingRequestOutput": "spyglass.core.engine.outputs",
    "EmbeddingOutput": "spyglass.core.engine.outputs",
    "ScoringRequestOutput": "spyglass.core.engine.outputs",
    "ScoringOutput": "spyglass.core.engine.outputs",
    "ClassificationRequestOutput": "spyglass.core.engine.outputs",
    "ClassificationOutput": "spyglass.core.engine.outputs",
    "LoRARequest": "spyglass.core.engine.lora_info",
    "BeamSearchParams": "spyglass.core.engine.beam_search",
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'spyglass' has no attribute {name!r}")
