"""Request and response bodies of ``POST /v1/embeddings``: OpenAI's, with vLLM's extras."""

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from spyglass.core.api.schemas import INT32, ChatMessage, Metadata

MAX_INPUTS = 2048  # inputs in one call, as OpenAI allows


class EmbeddingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's body: ``input`` is a string, a token list, or a list of either. vLLM's chat form
    sends ``messages`` instead (one conversation, rendered with the chat template, no generation
    prompt by default).

    vLLM's extras: ``truncate_prompt_tokens`` (keep each input's last tokens), ``normalize``
    (off: the raw final hidden state), ``add_special_tokens`` (BOS; by default for ``input``, not
    for ``messages``, whose template writes it), ``priority`` and ``cache_salt`` as for
    generation. Fields that would change the answer and are not implemented admit only their
    neutral values (`unsupported`)."""

    model: str | None = None
    input: str | list[Any] | None = None
    messages: list[ChatMessage] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1, le=INT32)] | None = None
    user: str | None = None
    metadata: Metadata | None = None
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=INT32)] | None = None
    normalize: bool = True
    add_special_tokens: bool | None = None
    priority: Annotated[int, Meta(ge=-INT32 - 1, le=INT32)] = 0
    cache_salt: Annotated[str, Meta(min_length=1, max_length=256)] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # Not implemented: only absent or neutral values pass, else a 400 naming the field.
    embed_dtype: Literal["float32"] = "float32"
    endianness: Literal["native", "little"] | None = None
    mm_processor_kwargs: None = None
    # vLLM's: the request's own chat template (with --trust-request-chat-template only).
    chat_template: Annotated[str, Meta(max_length=1 << 20)] | None = None

    unsupported: ClassVar[frozenset[str]] = frozenset(
        {"embed_dtype", "endianness", "mm_processor_kwargs"}
    )


class EmbeddingData(msgspec.Struct):
    """One input's vector: floats, or with ``encoding_format: "base64"`` the base64 of its
    little-endian float32 bytes (what the official clients ask for and decode)."""

    index: int
    embedding: list[float] | str
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(msgspec.Struct):
    """The input tokens the call embedded (after truncation); an embedding generates none."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(msgspec.Struct):
    """The vectors, in input order."""

    id: str
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage
    object: Literal["list"] = "list"
