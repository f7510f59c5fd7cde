"""``POST /classify`` (vLLM's): a sequence classifier's classes for each input.

Served by a ``...ForSequenceClassification`` checkpoint (a classifier, or a reward model with
one class); each input is a pooling request whose answer is the class probabilities at its last
token (softmax, a sigmoid for one class), or the raw logits with ``activation: false``.
"""

import time
from typing import Annotated, Any

import msgspec
from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from msgspec import Meta

from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import new_id, request_attributes
from spyglass.core.api.embedding_schemas import MAX_INPUTS, EmbeddingUsage
from spyglass.core.api.errors import APIError
from spyglass.core.api.pooling_runs import check_whole, pool_prompts, pooled_usage
from spyglass.core.api.prompts import count_prompts, parse_prompts
from spyglass.core.api.schemas import INT32, Metadata
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import pooling_request_params


class ClassificationRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``input`` as a string, a token list, or a list of either; vLLM's ``truncate_prompt_tokens``,
    ``priority`` and ``activation`` (off: raw logits, as a reward model's score is read)."""

    model: str | None = None
    input: str | list[Any]
    user: str | None = None
    metadata: Metadata | None = None
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=INT32)] | None = None
    priority: Annotated[int, Meta(ge=-INT32 - 1, le=INT32)] = 0
    activation: bool = True


class ClassificationData(msgspec.Struct):
    """One input's classes: the most likely one's name and every class's probability (or logit)."""

    index: int
    label: str
    probs: list[float]
    num_classes: int
    object: str = "classification"


class ClassificationResponse(msgspec.Struct):
    """The inputs' classes, in input order."""

    id: str
    created: int
    model: str
    data: list[ClassificationData]
    usage: EmbeddingUsage
    object: str = "list"


@post(
    ["/classify", "/v1/classify"],
    summary="Classify texts with a sequence classifier",
    tags=["vllm"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": ClassificationRequest},
)
async def create_classification(
    data: JSONBody[ClassificationRequest],
    request: Request,
    serving: NamedDependency[ServingContext],
) -> ClassificationResponse:
    """Each input's class probabilities and most likely label, in order."""
    lora_name = serving.check_model(data.model)
    serving.admit()
    if not serving.labels:
        raise APIError(
            400,
            "this model has no classification head: serve a ...ForSequenceClassification "
            "checkpoint to classify",
            "model",
        )
    params = pooling_request_params(
        PoolingParams(task="classify", activation=data.activation),
        data.truncate_prompt_tokens,
        data.priority,
    )
    response_id = new_id("classify")
    attributes = request_attributes(
        data, "classify", response_id, serving.model_name, request.headers
    )
    truncating = data.truncate_prompt_tokens is not None
    with serving.queue_slots(count_prompts(data.input), "input"):
        prompts = await parse_prompts(serving, data.input, not truncating, "input", MAX_INPUTS)
        for token_ids, _ in prompts:
            check_whole(serving, token_ids, truncating, "input")
        outputs = await pool_prompts(
            serving, request, response_id, prompts, params, attributes, lora_name
        )
    items = []
    for index, output in enumerate(outputs):
        probs = output.pooled
        best = max(range(len(probs)), key=probs.__getitem__)
        items.append(ClassificationData(index, serving.labels[best], probs, len(probs)))
    return ClassificationResponse(
        response_id,
        int(time.time()),
        serving.response_model(data.model),
        items,
        pooled_usage(outputs),
    )
