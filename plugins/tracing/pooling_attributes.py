"""Span attributes of pooling requests: embeddings (OpenInference's EMBEDDING kind, GenAI's
``embeddings`` operation) and sequence classification (EVALUATOR: a classifier or reward model
judging text). Neither samples, so their spans carry no sampling settings."""

import json

from spyglass.core.plugin_api import Request

# What a pooling request's span leaves out: it samples nothing, and it is no LLM call.
_NOT_FOR_POOLING = (
    "gen_ai.request.max_tokens",
    "gen_ai.request.temperature",
    "gen_ai.request.top_p",
    "llm.model_name",
    "llm.provider",
    "llm.invocation_parameters",
)


def pooling_request_attributes(attrs: dict, request: Request, model: str) -> dict:
    """``attrs`` (a request's arrival attributes) for a pooling request: its kind, and for an
    embedding ``embedding.model_name`` and whether it is normalized, for a classification
    whether the activation applies; none of the sampling settings."""
    pooling = request.sampling_params.pooling
    kept = {k: v for k, v in attrs.items() if k not in _NOT_FOR_POOLING}
    if pooling.task == "embed":
        kept["openinference.span.kind"] = "EMBEDDING"
        kept["embedding.model_name"] = model
        kept["spyglass.embedding.normalize"] = pooling.normalize
    else:
        kept["openinference.span.kind"] = "EVALUATOR"
        kept["spyglass.classify.activation"] = pooling.activation
    return kept


def pooling_input_attributes(request: Request, prompt_text: str) -> dict:
    """An embedding's input text as OpenInference records it (content tracing on)."""
    if request.sampling_params.pooling.task != "embed":
        return {}
    return {"embedding.embeddings.0.embedding.text": prompt_text}


def pooling_output_attributes(request: Request) -> dict:
    """What a pooling request answered (content tracing on: a vector encodes its text, and a
    classifier's verdict is about it): the vector, or the class probabilities as the output."""
    if request.sampling_params.pooling.task == "embed":
        return {"embedding.embeddings.0.embedding.vector": request.pooled}
    return {"output.value": json.dumps(request.pooled), "output.mime_type": "application/json"}


def pooling_finish_attributes(request: Request) -> dict:
    """The answer's size, known when it ends: the embedding's dimensions or the classes'
    number (not content)."""
    if request.sampling_params.pooling.task == "embed":
        return {"gen_ai.embeddings.dimension.count": len(request.pooled)}
    return {"spyglass.classify.num_classes": len(request.pooled)}
