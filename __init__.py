"""Spyglass: an observability-first LLM serving engine."""

from spyglass.core.llm import LLM
from spyglass.core.outputs import CompletionOutput, RequestOutput
from spyglass.core.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
