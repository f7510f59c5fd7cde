"""Reasoning items that round-trip through a client: ``include: ["reasoning.encrypted_content"]``
gives each reasoning output item an ``encrypted_content`` that a client keeping no state on the
server (``store: false``, as Codex and OpenAI's Agents SDK run) sends back in place of the text.

It is not encrypted: the reasoning is the client's to read anyway (the item's ``reasoning_text``
holds it). The blob is that text in base64 behind a marker saying this server wrote it. A blob
another server wrote (OpenAI's, which is encrypted) cannot be read here: a 400 naming ``input``.
A reasoning item sent back becomes the ``reasoning_content`` of the assistant turn after it,
which chat templates that render reasoning (Qwen3's) show the model.
"""

import base64
import binascii

from spyglass.core.api.errors import APIError
from spyglass.core.api.responses_schemas import InputItem, ReasoningText

_MARK = "spyglass-reasoning-v1:"


def encrypted_reasoning(text: str) -> str:
    """The ``encrypted_content`` of a reasoning item whose text is ``text``."""
    return _MARK + base64.b64encode(text.encode()).decode()


def reasoning_of(item: InputItem) -> str:
    """The text of a reasoning input item: its ``reasoning_text`` parts, else its
    ``encrypted_content`` read back; a 400 for a blob this server did not write."""
    if isinstance(item.content, list):
        return "".join(part.text for part in item.content if isinstance(part, ReasoningText))
    if item.encrypted_content is None:
        return item.content or ""
    if not item.encrypted_content.startswith(_MARK):
        raise APIError(
            400,
            "a reasoning item's encrypted_content was not written by this server and cannot be "
            "read here: send its reasoning_text content instead, or leave the item out",
            "input",
        )
    try:
        return base64.b64decode(item.encrypted_content[len(_MARK) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise APIError(400, "a reasoning item's encrypted_content is damaged", "input") from None
