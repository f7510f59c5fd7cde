"""``POST /v1/embeddings``: one vector per input, OpenAI's endpoint with vLLM's extras.

Each input is an engine request for its embedding (`SamplingParams.pooling`): it is batched with
generation, chunked, cached and traced like any other request, and its vector is the final norm's
output pooled as the server's pooling type says (its last token's by default), of unit length
unless ``normalize`` is off.
"""

import asyncio
import base64
import time

import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.chat import TemplateOptions, render_conversation
from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import new_id, request_attributes
from spyglass.core.api.embedding_schemas import (
    MAX_INPUTS,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
)
from spyglass.core.api.errors import APIError
from spyglass.core.api.pooling_runs import check_whole, pool_prompts, pooled_usage
from spyglass.core.api.prompts import count_prompts, encode_text, parse_prompts
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.sampling_params import pooling_request_params


@post(
    "/v1/embeddings",
    summary="Create embeddings",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": EmbeddingRequest},
)
async def create_embedding(
    data: JSONBody[EmbeddingRequest], request: Request, serving: NamedDependency[ServingContext]
) -> EmbeddingResponse:
    """The embedding of each ``input`` (or of the ``messages`` rendered as one prompt, with a
    vision model's images), in order."""
    lora_name = serving.check_model(data.model)
    serving.admit()
    if (data.input is None) == (data.messages is None):
        raise APIError(400, "send exactly one of input and messages", "input")
    if data.input is not None:
        _check_no_template_fields(data)
    params = pooling_request_params(
        PoolingParams(normalize=data.normalize, dimensions=data.dimensions),
        data.truncate_prompt_tokens,
        data.priority,
        data.cache_salt,
    )
    response_id = new_id("embd")
    attributes = request_attributes(
        data, "embeddings", response_id, serving.model_name, request.headers
    )
    num_inputs = 1 if data.input is None else count_prompts(data.input)
    with serving.queue_slots(num_inputs, "input"):
        prompts, images = await _prompts(serving, data)
        outputs = await pool_prompts(
            serving, request, response_id, prompts, params, attributes, lora_name, images
        )
    data_items = [
        EmbeddingData(index, _encoded(output.pooled, data.encoding_format))
        for index, output in enumerate(outputs)
    ]
    return EmbeddingResponse(
        response_id,
        int(time.time()),
        serving.response_model(data.model),
        data_items,
        pooled_usage(outputs),
    )


def _check_no_template_fields(data: EmbeddingRequest) -> None:
    """A 400 naming a chat-template field sent with ``input``: only ``messages`` are rendered."""
    for field, value in (
        ("add_generation_prompt", data.add_generation_prompt),
        ("continue_final_message", data.continue_final_message),
        ("chat_template_kwargs", data.chat_template_kwargs),
    ):
        if value:
            raise APIError(400, f"{field} applies to messages, not to input", field)


async def _prompts(
    serving: ServingContext, data: EmbeddingRequest
) -> tuple[list[tuple[list[int], str]], tuple[ImageInput, ...]]:
    """Each input's token ids and text, and the images of ``messages`` (a vision model's, placed
    in its one prompt); a 400 naming the field for one that cannot be embedded whole (longer
    than the context, without ``truncate_prompt_tokens``)."""
    truncating = data.truncate_prompt_tokens is not None
    placed: tuple[ImageInput, ...] = ()
    if data.messages is not None:
        template = TemplateOptions.of(data, serving.options)
        _, text, media = await render_conversation(
            serving, data.messages, param="messages", template=template
        )
        # The template writes BOS where the model wants it.
        add_special_tokens = bool(data.add_special_tokens)
        token_ids = await encode_text(serving, text, "messages", not truncating, add_special_tokens)
        token_ids, placed = await asyncio.to_thread(
            images_in_prompt,
            token_ids,
            media.images,
            serving.vision,
            serving.max_model_len,
            "messages",
            media.videos,
        )
        prompts, param = [(token_ids, text)], "messages"
    else:
        add_special_tokens = data.add_special_tokens is not False
        prompts = await parse_prompts(
            serving, data.input, not truncating, "input", MAX_INPUTS, add_special_tokens
        )
        param = "input"
    for token_ids, _ in prompts:
        check_whole(serving, token_ids, truncating, param)
    return prompts, placed


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """The vector as floats, or as base64 of its little-endian float32 bytes."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
