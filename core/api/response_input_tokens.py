"""``POST /v1/responses/input_tokens``: how many input tokens a Responses call would have (the
official client's ``responses.input_tokens.count``), as Anthropic's ``count_tokens`` counts a
Messages call's. Nothing runs on the engine."""

from typing import Annotated, Literal

import msgspec
from litestar import post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from msgspec import Meta

from spyglass.core.api.chat import render_conversation
from spyglass.core.api.context import ServingContext
from spyglass.core.api.prompts import encode_text
from spyglass.core.api.responses import (
    conversation,
    fitted_items,
    history_items,
    own_items,
    response_template,
    tool_use,
)
from spyglass.core.api.responses_schemas import (
    MAX_INPUT_ITEMS,
    ConversationRef,
    FunctionChoice,
    FunctionTool,
    InputItem,
    ReasoningSettings,
    ResponsesRequest,
    TextConfig,
)
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.prompt_images import prompt_with_image_tokens


class InputTokensRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields of a Responses call that make its prompt: its input, the turns it continues
    (``previous_response_id`` or ``conversation``), instructions, tools, reasoning effort and
    ``truncation`` (``auto``: the turns that would be kept)."""

    model: str | None = None
    input: str | Annotated[list[InputItem], Meta(max_length=MAX_INPUT_ITEMS)] | None = None
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: Annotated[str, Meta(max_length=256)] | None = None
    conversation: Annotated[str, Meta(max_length=256)] | ConversationRef | None = None
    reasoning: ReasoningSettings | None = None
    text: TextConfig | None = None  # its format holds the answer; the prompt is the same
    truncation: Literal["disabled", "auto"] | None = None


@post(
    "/v1/responses/input_tokens",
    summary="Count a response's input tokens (OpenAI Responses API)",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": InputTokensRequest},
)
async def count_input_tokens(
    data: JSONBody[InputTokensRequest], serving: NamedDependency[ServingContext]
) -> dict:
    """``{"object": "response.input_tokens", "input_tokens": N}``: the ``usage.input_tokens``
    that ``POST /v1/responses`` with these fields would report (the same items, template render
    and tokenizer). A conversation longer than the context is counted, not refused."""
    body = ResponsesRequest(
        **{name: getattr(data, name) for name in data.__struct_fields__ if name != "input"},
        input=data.input or [],
    )
    serving.check_model(body.model)
    use = tool_use(body)
    items = [*history_items(body, serving), *own_items(body)]
    template = response_template(body)
    if body.truncation == "auto":
        items, _ = await fitted_items(serving, body, items, use, template)
    turns = conversation(body.instructions, items)
    _, prompt, media = await render_conversation(serving, turns, use, "input", template)
    token_ids = await encode_text(
        serving, prompt, "input", must_fit=False, add_special_tokens=False
    )
    token_ids = prompt_with_image_tokens(token_ids, media.images, serving.vision, "input")
    return {"object": "response.input_tokens", "input_tokens": len(token_ids)}
