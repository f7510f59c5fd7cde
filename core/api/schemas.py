"""Request and response bodies of the OpenAI-compatible API, as msgspec Structs.

Requests keep OpenAI's field names and defaults; anything the client sends that we do not know
is ignored, as OpenAI clients add fields over time. Responses follow vLLM's shapes.
"""

from typing import Any, Literal

import msgspec


class StreamOptions(msgspec.Struct):
    """``stream_options``: whether a streamed response ends with a usage chunk."""

    include_usage: bool = False


class SamplingFields(msgspec.Struct, kw_only=True):
    """Sampling settings shared by completions and chat; vLLM's extras included."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None  # OpenAI's; ``session_id`` names the trace's session
    priority: int = 0
    ttft_slo_s: float | None = None  # time-to-first-token target, read by the slo scheduling policy


class CompletionRequest(SamplingFields, kw_only=True):
    """``POST /v1/completions``: ``prompt`` is a string, a token list, or a list of either."""

    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool = False


class TextPart(msgspec.Struct):
    """One part of a message's content list; only ``{"type": "text", "text": ...}`` is supported."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    """One conversation turn."""

    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


# -- responses ------------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct):
    """How many prompt tokens came from the prefix cache."""

    cached_tokens: int = 0


class Usage(msgspec.Struct):
    """Token counts of a whole response."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(msgspec.Struct):
    """Legacy completions logprobs: parallel lists, one entry per token."""

    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float]] = msgspec.field(default_factory=list)
    text_offset: list[int] = msgspec.field(default_factory=list)


class CompletionChoice(msgspec.Struct):
    """One completion (or a streamed piece of it)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class CompletionResponse(msgspec.Struct):
    """A completions response, or (``object == "text_completion"`` too) one streamed chunk."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: Usage | None = None


class TopLogprob(msgspec.Struct):
    """One alternative token in chat logprobs."""

    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(msgspec.Struct):
    """The logprob of one generated token, with the top alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    """``choices[i].logprobs`` of a chat response."""

    content: list[ChatTokenLogprob] | None


class AssistantMessage(msgspec.Struct):
    """The generated message."""

    content: str
    role: Literal["assistant"] = "assistant"


class ChatChoice(msgspec.Struct):
    """One chat answer."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(msgspec.Struct):
    """A non-streamed chat response."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class ChatDelta(msgspec.Struct, omit_defaults=True):
    """What a streamed chunk adds to a message; absent fields are left out."""

    role: str | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct):
    """One choice's piece in a streamed chat chunk."""

    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct):
    """One ``data:`` event of a streamed chat response."""

    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    usage: Usage | None = None


class ModelCard(msgspec.Struct):
    """One entry of ``GET /v1/models``."""

    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "spyglass"


class ModelList(msgspec.Struct):
    """``GET /v1/models``."""

    data: list[ModelCard]
    object: str = "list"
