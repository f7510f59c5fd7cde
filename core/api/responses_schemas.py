"""Request body of OpenAI's Responses API (``POST /v1/responses``), as msgspec Structs.

Fields the server cannot honour (reasoning summaries, built-in tools, other ``include`` values,
...) admit only their absent or neutral values: anything else is a 400 naming the field, never an
answer that pretends.
"""

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from spyglass.core.api.schemas import (
    PROMPT_CACHE_UNSUPPORTED,
    Identifier,
    Metadata,
    NumLogprobs,
    PositiveInt,
    PromptCacheOptions,
    ServiceTier,
)

MAX_INPUT_ITEMS = 4096
LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` value that asks for the logprobs of the message's tokens."""
ENCRYPTED_REASONING_INCLUDE = "reasoning.encrypted_content"
"""The ``include`` value that asks for reasoning items' ``encrypted_content``."""
Includable = Literal["message.output_text.logprobs", "reasoning.encrypted_content"]


class InputText(msgspec.Struct, tag_field="type", tag="input_text"):
    """A text part of the input."""

    text: str


class OutputText(msgspec.Struct, tag_field="type", tag="output_text"):
    """A text part of an earlier answer sent back."""

    text: str


class InputImage(msgspec.Struct, tag_field="type", tag="input_image", kw_only=True):
    """An image part (a vision model's): ``image_url`` a base64 data URL, or an http(s) URL of a
    host ``--allowed-media-domains`` lists; ``detail`` only ``auto``; no uploaded ``file_id``."""

    image_url: str
    detail: Literal["auto"] | None = None
    file_id: None = None


class ReasoningText(msgspec.Struct, tag_field="type", tag="reasoning_text"):
    """A reasoning item's text, sent back."""

    text: str


class SummaryText(msgspec.Struct, tag_field="type", tag="summary_text"):
    """A reasoning item's summary part (this server writes none; one sent back is not read)."""

    text: str


ItemText = str | Annotated[list[InputText | OutputText], Meta(max_length=MAX_INPUT_ITEMS)]
ItemContent = (
    str
    | Annotated[
        list[InputText | OutputText | InputImage | ReasoningText], Meta(max_length=MAX_INPUT_ITEMS)
    ]
)


class InputItem(msgspec.Struct, kw_only=True):
    """One input item: a ``message`` (``role`` and ``content``), a ``function_call`` the model made earlier
    (``call_id``, ``name``, ``arguments``), a ``function_call_output`` (``call_id``, ``output``),
    or a ``reasoning`` item an earlier answer gave (its ``reasoning_text`` ``content``, or its
    ``encrypted_content``; `reasoning_items`)."""

    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: ItemContent | None = None
    call_id: Annotated[str, Meta(max_length=256)] | None = None
    name: Annotated[str, Meta(max_length=64)] | None = None
    arguments: str | None = None
    output: ItemText | None = None
    id: str | None = None
    status: str | None = None
    summary: Annotated[list[SummaryText], Meta(max_length=MAX_INPUT_ITEMS)] | None = None
    encrypted_content: Annotated[str, Meta(max_length=1 << 24)] | None = None


class FunctionTool(msgspec.Struct, kw_only=True):
    """``{"type": "function", "name", "description", "parameters", "strict"}`` (the Responses API's flat shape);
    other tool types (``web_search``, ``file_search``, ...) are refused by the handler."""

    type: Annotated[str, Meta(max_length=64)]
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(msgspec.Struct):
    """``tool_choice: {"type": "function", "name": ...}``."""

    type: Literal["function"]
    name: str


class TextFormatText(msgspec.Struct, tag_field="type", tag="text"):
    """``text.format: {"type": "text"}``: no constraint."""


class TextFormatJsonObject(msgspec.Struct, tag_field="type", tag="json_object"):
    """``text.format: {"type": "json_object"}``: any JSON object."""


class TextFormatJsonSchema(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True):
    """``text.format: {"type": "json_schema", "name", "schema", "strict"}``: output held to the schema."""

    name: Annotated[str, Meta(max_length=64)] = "response"
    schema_: dict[str, Any] = msgspec.field(name="schema", default_factory=dict)
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    """``text``: the output's format (``verbosity`` other than the default cannot be honoured)."""

    format: TextFormatText | TextFormatJsonObject | TextFormatJsonSchema | None = None
    verbosity: Literal["medium"] | None = None


class ReasoningSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``reasoning``: its ``effort`` reaches the chat template as ``reasoning_effort`` (as chat's
    field does, a 400 where the template does not read it); summaries are not made: only absent."""

    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: None = None
    generate_summary: None = None


class ResponsesStreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``stream_options``: events carry no ``obfuscation`` padding here, so only ``false`` passes."""

    include_obfuscation: Literal[False] = False


class ConversationRef(msgspec.Struct, forbid_unknown_fields=True):
    """``conversation: {"id": ...}``, the object form of a conversation's id."""

    id: Annotated[str, Meta(max_length=256)]


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/responses``."""

    input: str | Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_INPUT_ITEMS)]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    user: str | None = None
    metadata: Metadata | None = None
    store: bool | None = None  # kept unless false, where the server keeps responses
    previous_response_id: Annotated[str, Meta(max_length=256)] | None = None
    # A kept conversation the call continues, and which its input and output then join.
    conversation: Annotated[str, Meta(max_length=256)] | ConversationRef | None = None
    background: bool | None = None  # answered in a task of its own, read back by GET
    # Honoured: the message's tokens' logprobs, reasoning as encrypted_content (others: a 400).
    include: Annotated[list[Includable], Meta(max_length=8)] | None = None
    top_logprobs: NumLogprobs | None = None  # alternatives per token (logprobs without include)
    service_tier: ServiceTier | None = None  # flex and priority: queue priorities (`service_tiers`)
    # Not honoured by this server: only absent or neutral values pass, else a 400 naming the field.
    reasoning: ReasoningSettings | None = None
    prompt: None = None
    truncation: Literal["disabled", "auto"] | None = None  # auto: drop the oldest turns to fit
    max_tool_calls: None = None
    stream_options: ResponsesStreamOptions | None = None
    context_management: None = None
    # As chat's (`ChatCompletionRequest`).
    prompt_cache_key: Identifier | None = None
    safety_identifier: Identifier | None = None
    prompt_cache_retention: Literal["in_memory"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    moderation: None = None

    unsupported: ClassVar[frozenset[str]] = frozenset(
        {
            *PROMPT_CACHE_UNSUPPORTED,
            "context_management",
            "stream_options.include_obfuscation",
            "reasoning.summary",
            "reasoning.generate_summary",
            "include",
            "prompt",
            "max_tool_calls",
        }
    )
    n: ClassVar[int] = 1  # one answer per call
