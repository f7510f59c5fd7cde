"""``POST /tokenize`` and ``POST /detokenize``: the served model's tokenizer, as vLLM's server exposes it."""

import asyncio
from typing import Annotated, Any

import msgspec
from litestar import post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from msgspec import Meta

from spyglass.core.api.chat import TemplateOptions, render_conversation
from spyglass.core.api.context import ServingContext
from spyglass.core.api.errors import APIError
from spyglass.core.api.prompts import check_token_ids, encode_text
from spyglass.core.api.schemas import ChatMessage, TemplateDocuments, TokenId
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.chat_images import ChatMedia
from spyglass.core.engine.prompt_images import prompt_with_image_tokens


class TokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Either ``prompt`` (text) or ``messages`` (rendered with the chat template first)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # Whether BOS is added (where the model wants one); by default for a prompt, not for messages,
    # whose template writes it: the ids are then the ones chat requests send to the engine.
    add_special_tokens: bool | None = None
    # How ``messages`` are rendered, as in chat requests.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: Annotated[str, Meta(max_length=1 << 20)] | None = None
    documents: TemplateDocuments | None = None


class TokenizeResponse(msgspec.Struct):
    """The token ids, how many, and the context they must fit in."""

    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Token ids to turn back into text."""

    tokens: Annotated[list[TokenId], Meta(max_length=1 << 20)]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct):
    """The text of the token ids, special tokens included."""

    prompt: str


@post(
    "/tokenize",
    summary="Tokenize a prompt or chat messages",
    tags=["tokenizer"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": TokenizeRequest},
)
async def tokenize(
    data: JSONBody[TokenizeRequest], serving: NamedDependency[ServingContext]
) -> TokenizeResponse:
    """The ids the engine would see for ``prompt`` or for ``messages`` after the chat template."""
    serving.check_model(data.model)
    if (data.prompt is None) == (data.messages is None):
        raise APIError(400, "send exactly one of prompt and messages", "prompt")
    media = ChatMedia()
    if data.messages is not None:
        template = TemplateOptions.of(data, serving.options)
        _, text, media = await render_conversation(serving, data.messages, template=template)
    else:
        text = data.prompt
    # A prompt gets BOS where the model wants one; a rendered conversation has it from its template.
    add_special_tokens = data.add_special_tokens
    if add_special_tokens is None:
        add_special_tokens = data.messages is None
    tokens = await encode_text(
        serving,
        text,
        "prompt" if data.messages is None else "messages",
        add_special_tokens=add_special_tokens,
    )
    # A vision model's images and videos count as the tokens they fill.
    tokens = prompt_with_image_tokens(
        tokens, media.images, serving.vision, "messages", media.videos
    )
    return TokenizeResponse(len(tokens), serving.max_model_len, tokens)


@post(
    "/detokenize",
    summary="Detokenize token ids",
    tags=["tokenizer"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": DetokenizeRequest},
)
async def detokenize(
    data: JSONBody[DetokenizeRequest], serving: NamedDependency[ServingContext]
) -> DetokenizeResponse:
    """The text of ``tokens``."""
    serving.check_model(data.model)
    token_ids = check_token_ids(serving, data.tokens, "tokens")
    return DetokenizeResponse(await asyncio.to_thread(serving.tokenizer.decode, token_ids, False))
