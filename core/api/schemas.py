"""Request and response bodies of the OpenAI-compatible API, as msgspec Structs.

Requests keep OpenAI's field names and defaults; anything the client sends that we do not know
is ignored, as OpenAI clients add fields over time, except the fields listed in `UNSUPPORTED`,
which would change the answer and so admit only their neutral values until implemented. Numeric ranges follow vLLM's
limits and are part of the published OpenAPI schema. Responses follow vLLM's shapes.
"""

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

MAX_N = 128
MAX_STOP = 16  # stop sequences per request
MAX_LOGPROBS = 20
INT32 = (1 << 31) - 1
INT64 = (1 << 63) - 1

MAX_STOP_TOKEN_IDS = 256
MAX_BAD_WORDS = 256

PositiveInt = Annotated[int, Meta(ge=1, le=INT32)]
TokenId = Annotated[int, Meta(ge=0, le=INT32)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
NumLogprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
StopText = Annotated[str, Meta(max_length=1024)]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    """``stream_options``: whether a streamed response ends with a usage chunk, and (vLLM's
    ``continuous_usage_stats``, with ``include_usage``) whether every chunk carries the usage so far.
    Chunks carry no ``obfuscation`` padding here: ``include_obfuscation`` passes only ``false``."""

    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: Literal[False] = False


class TextResponseFormat(msgspec.Struct, tag_field="type", tag="text"):
    """``response_format: {"type": "text"}``: no constraint."""


class JsonObjectResponseFormat(msgspec.Struct, tag_field="type", tag="json_object"):
    """``response_format: {"type": "json_object"}``: any JSON object."""


class JsonSchemaSpec(msgspec.Struct, kw_only=True):
    """``response_format.json_schema``: OpenAI's named schema (output is always held to it, strict or not)."""

    name: Annotated[str, Meta(max_length=64)] = "response"
    description: str | None = None
    schema_: dict[str, Any] = msgspec.field(name="schema", default_factory=dict)
    strict: bool | None = None


class JsonSchemaResponseFormat(msgspec.Struct, tag_field="type", tag="json_schema"):
    """``response_format: {"type": "json_schema", "json_schema": {...}}``."""

    json_schema: JsonSchemaSpec


class StructuralTagStructure(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One structure of a structural tag: the text that opens it, its JSON's schema, the text that closes it."""

    begin: Annotated[str, Meta(min_length=1, max_length=1024)]
    schema_: dict[str, Any] = msgspec.field(name="schema")
    end: Annotated[str, Meta(max_length=1024)]


class StructuralTagResponseFormat(msgspec.Struct, tag_field="type", tag="structural_tag"):
    """``response_format: {"type": "structural_tag", "structures": [...], "triggers": [...]}``
    (vLLM's and xgrammar's): any text, but a trigger opens one of the structures whose ``begin``
    starts with it, whose JSON obeys its schema. xgrammar's newer ``format`` form is not served."""

    structures: Annotated[list[StructuralTagStructure], Meta(min_length=1, max_length=256)]
    triggers: Annotated[
        list[Annotated[str, Meta(min_length=1, max_length=1024)]], Meta(min_length=1, max_length=16)
    ]

    def spec(self) -> dict:
        """The structural tag as `StructuredOutput`'s value."""
        return {
            "structures": [
                {"begin": s.begin, "schema": s.schema_, "end": s.end} for s in self.structures
            ],
            "triggers": list(self.triggers),
        }


ResponseFormat = (
    TextResponseFormat
    | JsonObjectResponseFormat
    | JsonSchemaResponseFormat
    | StructuralTagResponseFormat
)


class StructuredOutputsSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs`` (the newer spelling of its ``guided_*`` fields): at most one
    of ``json`` (a schema, or its JSON text), ``regex``, ``choice``, ``grammar``, ``json_object``,
    ``structural_tag`` (its spec, or its JSON text). Its other options (``whitespace_pattern``,
    ...) are refused by name."""

    json: dict[str, Any] | str | None = None
    regex: Annotated[str, Meta(max_length=4096)] | None = None
    choice: Annotated[list[str], Meta(min_length=1, max_length=1024)] | None = None
    grammar: Annotated[str, Meta(max_length=65536)] | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None


LogitBias = Annotated[dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]], Meta(max_length=1024)]


TemplateDocuments = Annotated[list[dict[str, Any]], Meta(max_length=1024)]
"""Documents a chat template renders (HF's ``documents``: ``[{"title": ..., "text": ...}]``)."""

UNSUPPORTED_SAMPLING = frozenset(
    {
        "functions",  # OpenAI's deprecated spelling of tools
        "function_call",
        "logits_processors",  # vLLM's extras from here on
        "spaces_between_special_tokens",
    }
)
"""Sampling fields of OpenAI's and vLLM's that this server does not implement yet."""

Identifier = Annotated[str, Meta(min_length=1, max_length=512)]
"""A caller's stable name for its end user or its prompt family (OpenAI's ``safety_identifier`` and
``prompt_cache_key``): it goes on the call's trace, so it is bounded like a metadata value."""


class PromptCacheOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's ``prompt_cache_options``. The prefix cache here places no breakpoints (every full KV
    block of every prompt is cached and shared) and promises no lifetime (a block stays until its
    memory is needed): the implicit mode is what it does; explicit breakpoints or a ``ttl`` are a
    400."""

    mode: Literal["implicit"] = "implicit"
    ttl: None = None


PROMPT_CACHE_UNSUPPORTED = ("prompt_cache_retention", "prompt_cache_options", "moderation")
"""OpenAI's prompt-cache and moderation fields (chat's and Responses') that only pass neutral:
the prefix cache lives in memory (``prompt_cache_retention: "in_memory"``), and no moderation
model runs here."""

ServiceTier = Literal["auto", "default", "flex", "priority"]
"""OpenAI's processing tiers (`spyglass.core.api.service_tiers`)."""

UNSUPPORTED_CHAT = frozenset(
    {
        "mm_processor_kwargs",
        "modalities",
        "audio",
        "web_search_options",
        "verbosity",
        *PROMPT_CACHE_UNSUPPORTED,
        "stream_options.include_obfuscation",
    }
)
"""Chat fields of OpenAI's (and vLLM's ``mm_processor_kwargs``) that this server does not honour:
a value other than the neutral one is a 400 naming the field."""

Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(max_length=16),
]
"""A call's ``metadata``, within OpenAI's limits (16 pairs, keys of 64 characters, values of 512):
on the call's trace (``metadata``; Langfuse's trace metadata), ``session_id`` its session."""


class SamplingFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Sampling settings shared by completions and chat; vLLM's extras included."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    # None: the model's default (--generation-config), else the API's (1, 1, off, 0, 1).
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT32)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_N)] = 1
    stop: StopText | Annotated[list[StopText], Meta(max_length=MAX_STOP)] | None = None
    seed: Annotated[int, Meta(ge=-INT64 - 1, le=INT64)] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: Metadata | None = None
    priority: Annotated[int, Meta(ge=-INT32 - 1, le=INT32)] = 0
    # Time-to-first-token target, read by the slo scheduling policy.
    ttft_slo_s: Annotated[float, Meta(gt=0.0, le=86400.0)] | None = None
    response_format: ResponseFormat | None = None
    logit_bias: LogitBias | None = None
    # vLLM's structured-output extras; at most one constraint per request, response_format included.
    guided_json: dict[str, Any] | None = None
    guided_regex: Annotated[str, Meta(max_length=4096)] | None = None
    guided_choice: Annotated[list[str], Meta(min_length=1, max_length=1024)] | None = None
    guided_grammar: Annotated[str, Meta(max_length=65536)] | None = None
    structured_outputs: StructuredOutputsSpec | None = None
    # vLLM's output controls (see SamplingParams).
    min_tokens: Annotated[int, Meta(ge=0, le=INT32)] = 0
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    allowed_token_ids: Annotated[list[TokenId], Meta(min_length=1, max_length=1 << 18)] | None = (
        None
    )
    bad_words: Annotated[list[StopText], Meta(max_length=MAX_BAD_WORDS)] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Logprobs name tokens ``token_id:N`` rather than by their text.
    return_tokens_as_token_ids: bool = False
    # vLLM's: the prompt's token ids and each choice's generated ones ride on the answer
    # (`TokenIds`), for callers that must not re-tokenize text (RL rollouts, exact replays).
    return_token_ids: bool = False
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=INT32)] | None = None
    # vLLM's: the request's prefix-cache blocks are shared only with requests of the same salt.
    cache_salt: Annotated[str, Meta(min_length=1, max_length=256)] | None = None
    # vLLM's beam search (`beam_search_api`): ``n`` beams, ranked with this length penalty.
    use_beam_search: bool = False
    length_penalty: Annotated[float, Meta(ge=-10.0, le=10.0)] = 1.0
    # Not implemented: only absent or neutral values pass, else a 400 (`UNSUPPORTED_SAMPLING`).
    functions: Annotated[list[Any], Meta(max_length=0)] | None = None
    function_call: Literal["none"] | None = None
    logits_processors: Annotated[list[Any], Meta(max_length=0)] | None = None
    spaces_between_special_tokens: Literal[True] = True


class CompletionRequest(SamplingFields, kw_only=True):
    """``POST /v1/completions``: ``prompt`` is a string, a token list, or a list of either."""

    prompt: str | list[Any]
    logprobs: NumLogprobs | None = None
    echo: bool = False
    # Candidates per prompt, of which the ``n`` with the highest cumulative logprob are returned.
    best_of: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None
    # vLLM's: each prompt token's logprob (after the first) and this many top alternatives.
    prompt_logprobs: NumLogprobs | None = None
    # vLLM's: whether a text prompt is encoded with the tokenizer's special tokens (BOS).
    add_special_tokens: bool = True
    # Fill in the middle: the text after the completion (a code model's; `fill_in_middle`).
    suffix: str | None = None
    # Not implemented for completions: only absent or neutral values pass, else a 400.
    tools: Annotated[list[Any], Meta(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: None = None

    unsupported: ClassVar[frozenset[str]] = UNSUPPORTED_SAMPLING | {
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }


class FunctionDefinition(msgspec.Struct, kw_only=True):
    """A function the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(msgspec.Struct):
    """``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(msgspec.Struct):
    """The function a named ``tool_choice`` forces."""

    name: str


class NamedToolChoice(msgspec.Struct):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    function: FunctionName


class FunctionCall(msgspec.Struct):
    """A call's function name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    """One call the assistant made (in a response, or in the history a client sends back)."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    """A text part of a message's content list: ``{"type": "text", "text": ...}``."""

    text: str


class ImageURL(msgspec.Struct):
    """Where an image is: a base64 ``data:`` URL, or an http(s) URL of a host that
    ``--allowed-media-domains`` names. ``detail`` may be ``auto`` only: a vision model reads every
    image as its image processor's config says (one resolution, or Idefics3's tiles)."""

    url: str
    detail: Literal["auto"] | None = None


class ImageURLPart(msgspec.Struct, tag_field="type", tag="image_url"):
    """An image part of a message's content list (a vision model's):
    ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``."""

    image_url: ImageURL


class VideoURL(msgspec.Struct):
    """Where a video is: a base64 ``data:`` URL (a container file, ``data:video/mp4;base64,...``,
    or vLLM's frames, ``data:video/jpeg;base64,<frame>,<frame>,...``), or an http(s) URL of a
    host that ``--allowed-media-domains`` names."""

    url: str


class VideoURLPart(msgspec.Struct, tag_field="type", tag="video_url"):
    """A video part of a message's content list (vLLM's; a Qwen2-VL model's):
    ``{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}``."""

    video_url: VideoURL


class ChatMessage(msgspec.Struct):
    """One conversation turn."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImageURLPart | VideoURLPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool turns: which call this is the result of
    # Assistant turns: the reasoning before the answer, for templates that render it (vLLM's field).
    reasoning_content: str | None = None


class PredictedContent(msgspec.Struct):
    """OpenAI's ``prediction``: text the answer is expected to mostly repeat (a file to edit, say),
    ``{"type": "content", "content": text or text parts}``."""

    type: Literal["content"]
    content: Annotated[str, Meta(max_length=1 << 20)] | list[TextPart]

    @property
    def text(self) -> str:
        """The predicted text, its parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: NumLogprobs | None = None
    tools: Annotated[list[ToolDefinition], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # vLLM's chat extras: how the template renders the conversation, and (echo) whether a final
    # assistant message the model continues is repeated at the start of the answer.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False
    # vLLM's: the rendered conversation is encoded with the tokenizer's special tokens (BOS) too.
    add_special_tokens: bool = False
    # vLLM's: each prompt token's logprob and its top alternatives' (not streamed).
    prompt_logprobs: NumLogprobs | None = None
    # vLLM's: the request's own chat template (a server run with --trust-request-chat-template
    # only), and documents for retrieval-augmented templates.
    chat_template: Annotated[str, Meta(max_length=1 << 20)] | None = None
    documents: TemplateDocuments | None = None
    # OpenAI's: passed to the chat template as a variable (as vLLM does), for the templates that
    # read it (gpt-oss's and others'); a 400 where the template would ignore it.
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    # vLLM's: at most this many tokens of thought, then the closing tag is forced
    # (`reasoning_output.thinking_constraint`; needs a --reasoning-parser whose tags a grammar holds).
    thinking_token_budget: PositiveInt | None = None
    # OpenAI's predicted outputs: n-gram speculation drafts from it (`SamplingParams.prediction`).
    prediction: PredictedContent | None = None
    service_tier: ServiceTier | None = None  # flex and priority: queue priorities (`service_tiers`)
    store: bool | None = None  # kept for GET /v1/chat/completions/{id} (`chat_store`)
    # Not implemented: only absent or neutral values pass (`UNSUPPORTED_CHAT`).
    mm_processor_kwargs: None = None  # the server's own: --mm-processor-kwargs
    modalities: list[Literal["text"]] | None = None  # audio output
    audio: None = None
    web_search_options: None = None
    verbosity: None = None
    # OpenAI's prompt-cache hints and end-user name (`PROMPT_CACHE_UNSUPPORTED`, `Identifier`).
    prompt_cache_key: Identifier | None = None
    safety_identifier: Identifier | None = None
    prompt_cache_retention: Literal["in_memory"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    moderation: None = None

    unsupported: ClassVar[frozenset[str]] = UNSUPPORTED_SAMPLING | UNSUPPORTED_CHAT


# -- responses ------------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct):
    """How many prompt tokens came from the prefix cache."""

    cached_tokens: int = 0


class CompletionTokensDetails(msgspec.Struct, omit_defaults=True):
    """How many completion tokens the model spent reasoning (with ``--reasoning-parser``), and with
    a ``prediction`` how many drafted tokens were accepted and rejected (OpenAI's
    ``accepted_prediction_tokens`` and ``rejected_prediction_tokens``: every draft verified, from
    the prediction or the n-gram lookup it falls back to)."""

    reasoning_tokens: int  # always written; the others only with a prediction
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None


class Usage(msgspec.Struct, omit_defaults=True):
    """Token counts of a whole response (``completion_tokens_details`` only where reasoning is
    split)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class CompletionLogprobs(msgspec.Struct):
    """Legacy completions logprobs: parallel lists, one entry per token."""

    tokens: list[str] = msgspec.field(default_factory=list)
    # None for an echoed prompt's first token, which nothing before it scores.
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = msgspec.field(default_factory=list)
    text_offset: list[int] = msgspec.field(default_factory=list)


class PromptLogprob(msgspec.Struct):
    """vLLM's entry of ``prompt_logprobs``: a token's logprob, its rank and its text."""

    logprob: float
    rank: int | None
    decoded_token: str


TokenIds = list[int] | msgspec.UnsetType
"""vLLM's ``token_ids`` and ``prompt_token_ids`` of an answer, with ``return_token_ids``: the
generated ids (a stream's chunk: those it adds) and the prompt's (a stream's first chunk of each
choice); left out of the JSON unless asked for."""


class CompletionChoice(msgspec.Struct):
    """One completion (or a streamed piece of it)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # vLLM's: per prompt token (None for the first), the token and the top alternatives by id.
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
    prompt_token_ids: TokenIds = msgspec.UNSET
    token_ids: TokenIds = msgspec.UNSET


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
    """The generated message: text, or the tool calls the model made (content then None or what came before)."""

    content: str | None
    role: Literal["assistant"] = "assistant"
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    reasoning_content: str | None = None
    """The model's reasoning before its answer (vLLM's field; with ``--reasoning-parser``)."""


class ChatChoice(msgspec.Struct):
    """One chat answer."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: TokenIds = msgspec.UNSET


class ChatCompletionResponse(msgspec.Struct):
    """A non-streamed chat response (vLLM's ``prompt_logprobs``: the rendered prompt's, as a
    completion's choice has them)."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
    prompt_token_ids: TokenIds = msgspec.UNSET
    service_tier: str | msgspec.UnsetType = msgspec.UNSET


class FunctionCallDelta(msgspec.Struct, omit_defaults=True):
    """A streamed piece of a call's function: the name comes once, arguments are concatenated."""

    name: str | None = None
    arguments: str = ""


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    """A streamed piece of tool call ``index``: its id and type come with its first piece."""

    index: int
    function: FunctionCallDelta
    id: str | None = None
    type: str | None = None


class ChatDelta(msgspec.Struct, omit_defaults=True):
    """What a streamed chunk adds to a message; absent fields are left out."""

    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None


class ChatChunkChoice(msgspec.Struct):
    """One choice's piece in a streamed chat chunk."""

    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: TokenIds = msgspec.UNSET


class ChatCompletionChunk(msgspec.Struct):
    """One ``data:`` event of a streamed chat response."""

    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    usage: Usage | None = None
    prompt_token_ids: TokenIds = msgspec.UNSET
    service_tier: str | msgspec.UnsetType = msgspec.UNSET


class ModelCard(msgspec.Struct):
    """One entry of ``GET /v1/models``."""

    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "spyglass"
    root: str | None = None
    """Where the model or adapter was loaded from (vLLM's field)."""
    parent: str | None = None
    """For a LoRA adapter, the model it adapts."""


class ModelList(msgspec.Struct):
    """``GET /v1/models``."""

    data: list[ModelCard]
    object: str = "list"
