"""Request and response bodies of Anthropic's Messages API (``POST /v1/messages``), as msgspec Structs."""

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from spyglass.core.api.schemas import INT32, Metadata, StopText

MAX_STOP_SEQUENCES = 16


class TextBlock(msgspec.Struct, tag_field="type", tag="text"):
    """A block of text."""

    text: str


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking"):
    """The model's reasoning before its answer (with ``--reasoning-parser``); a client may send it
    back in an assistant turn, where it is left out of the prompt. The signature is empty: it
    vouches for nothing here."""

    thinking: str
    signature: str = ""


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use"):
    """A call the assistant made: its id, the tool's name and its input object."""

    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result", kw_only=True):
    """What a tool returned for call ``tool_use_id`` (text, or text blocks); an error's text
    reaches the prompt as ``Error: {text}``."""

    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False


class Base64ImageSource(msgspec.Struct, tag_field="type", tag="base64"):
    """An image's bytes, base64-encoded."""

    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLImageSource(msgspec.Struct, tag_field="type", tag="url"):
    """An image's URL: fetched by the server only from ``--allowed-media-domains`` hosts."""

    url: str


class ImageBlock(msgspec.Struct, tag_field="type", tag="image"):
    """An image in a user turn (a vision model's)."""

    source: Base64ImageSource | URLImageSource


Block = TextBlock | ImageBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


class InputMessage(msgspec.Struct):
    """One turn: a user or an assistant, with text or blocks."""

    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(msgspec.Struct, kw_only=True):
    """A tool the model may use, with a JSON schema of its input."""

    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool = False  # its inputs are held to the schema, as OpenAI's strict functions


class ToolChoice(msgspec.Struct, kw_only=True):
    """``auto`` (the model decides), ``any`` (some tool), ``tool`` (the one ``name``d) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingSetting(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``thinking``: ``disabled``, ``adaptive`` (the model decides how much to think, as a
    reasoning model does) or ``enabled`` (at most ``budget_tokens`` of thinking), through the chat
    template's ``enable_thinking`` where it reads it (`messages.thinking_template`); the budget
    is held by the reasoning format's grammar (`messages.thinking_budget`). A server started
    with ``--reasoning-parser`` returns the model's thinking as ``thinking`` blocks."""

    type: Literal["disabled", "adaptive", "enabled"]
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None


class JSONOutputFormat(msgspec.Struct, tag_field="type", tag="json_schema"):
    """``output_config.format``: the answer's text is JSON valid against ``schema`` (structured
    outputs, enforced token by token as chat's ``response_format`` is)."""

    schema_: dict[str, Any] = msgspec.field(name="schema")


class OutputConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``output_config``: its ``format`` is honoured; an ``effort`` (how hard Claude thinks) has no
    counterpart in an open model's sampling: only absent."""

    format: JSONOutputFormat | None = None
    effort: None = None


class CacheControl(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``cache_control: {"type": "ephemeral"}``: what the prefix cache does for every prompt unasked
    (each full KV block is cached, marked or not). A ``ttl`` asks for a lifetime it does not
    promise (a block stays until its memory is needed): a 400."""

    type: Literal["ephemeral"]
    ttl: None = None


class Conversation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a Messages call's prompt is made of: the body of ``POST /v1/messages/count_tokens``."""

    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingSetting | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None
    speed: Literal["standard"] | None = None  # fast mode

    unsupported: ClassVar[frozenset[str]] = frozenset(
        {"output_config.effort", "cache_control.ttl", "speed"}
    )


class MessagesRequest(Conversation, kw_only=True):
    """``POST /v1/messages``."""

    max_tokens: Annotated[int, Meta(ge=1, le=INT32)]
    stop_sequences: Annotated[list[StopText], Meta(max_length=MAX_STOP_SEQUENCES)] | None = None
    # None: the model's default (--generation-config), else the API's (1, 1, off).
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=INT32)] | None = None
    stream: bool = False
    metadata: Metadata | None = None  # ``user_id`` is the request's user
    service_tier: Literal["auto", "standard_only"] | None = None  # both are this server's one tier
    # Not honoured by this server (Anthropic runs these tools): only absent or neutral values pass.
    mcp_servers: Annotated[list[Any], Meta(max_length=0)] | None = None
    container: None = None
    context_management: None = None
    inference_geo: None = None  # this server runs where it runs
    diagnostics: None = None  # prompt-cache miss reasons

    n: ClassVar[int] = 1  # one message per call
    unsupported: ClassVar[frozenset[str]] = Conversation.unsupported | {
        "mcp_servers",
        "container",
        "context_management",
        "inference_geo",
        "diagnostics",
    }

    @property
    def user(self) -> str | None:
        """``metadata.user_id``: the request's user, as plugins see it."""
        return (self.metadata or {}).get("user_id")


class TokenCount(msgspec.Struct):
    """``POST /v1/messages/count_tokens``'s answer."""

    input_tokens: int


class Usage(msgspec.Struct):
    """Token counts, as Anthropic splits the prompt's: ``input_tokens`` computed afresh,
    ``cache_read_input_tokens`` read from the prefix cache (which caches every prompt unasked,
    so nothing counts as a cache write: ``cache_creation_input_tokens`` is 0)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(msgspec.Struct, kw_only=True):
    """The assistant's message: its thinking, text and tool-use blocks, and why it stopped."""

    id: str
    model: str
    content: list[ThinkingBlock | TextBlock | ToolUseBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: Usage
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
