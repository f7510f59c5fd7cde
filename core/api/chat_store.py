"""OpenAI's stored chat completions: the chat calls made with ``store: true``, kept for
``GET /v1/chat/completions`` (listed, filtered by ``model`` and ``metadata``), ``GET
/v1/chat/completions/{id}`` (and ``.../messages``), ``POST`` (new ``metadata``) and ``DELETE``.

Kept in the server's memory, the most recent ``capacity`` of them (the oldest is dropped first).
Each keeps the completion object the client got (a streamed one as its chunks add up to it),
the call's ``metadata``, and the messages it was sent. How many are kept is
``spyglass:chat_completions_kept``.
"""

from dataclasses import dataclass

import msgspec

from spyglass.core.api.schemas import ChatMessage, TextPart


@dataclass(slots=True)
class StoredChatCompletion:
    """A stored chat completion: the object the client got, with the call's ``metadata`` (which
    ``POST /v1/chat/completions/{id}`` replaces), and the messages it was sent."""

    completion: dict
    messages: tuple[ChatMessage, ...]

    @property
    def id(self) -> str:
        return self.completion["id"]

    def matches(self, model: str | None, metadata: dict[str, str]) -> bool:
        """Whether it was made by ``model`` (any when None) and carries every pair of ``metadata``."""
        kept = self.completion["metadata"]
        same_model = model is None or self.completion["model"] == model
        return same_model and all(kept.get(key) == value for key, value in metadata.items())


def listed_message(completion_id: str, index: int, message: ChatMessage) -> dict:
    """Message ``index`` of a stored completion's request, as ``.../messages`` lists it: its id,
    role and text (``content_parts`` too when it was sent as parts), and its name, tool calls or
    tool call id where it had them."""
    listed = {"id": f"{completion_id}-{index}", "role": message.role}
    if isinstance(message.content, list):
        parts = msgspec.to_builtins(message.content)
        text = "".join(part.text for part in message.content if isinstance(part, TextPart))
        listed |= {"content": text, "content_parts": parts}
    else:
        listed |= {"content": message.content, "content_parts": None}
    for field in ("name", "tool_calls", "tool_call_id"):
        if getattr(message, field) is not None:
            listed[field] = msgspec.to_builtins(getattr(message, field))
    return listed
