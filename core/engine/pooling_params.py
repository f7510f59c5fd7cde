"""What an embedding request asks for: vLLM's ``PoolingParams`` for the ``embed`` task.

An embedding request is an engine request like any other (it is scheduled, chunked, cached and
preempted the same way), whose answer is a vector instead of text: the final norm's output at its
prompt's last token (last-token pooling, as vLLM pools decoder models for embeddings). Because the
last token is always computed, prefix-cache hits serve embedding requests too.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PoolingParams:
    """How to pool the prompt: ``normalize`` scales the vector to unit length (cosine similarity is
    then a dot product); ``dimensions`` must be None or the model's hidden size (no served model is
    trained to be cut shorter, Matryoshka style)."""

    normalize: bool = True
    dimensions: int | None = None
