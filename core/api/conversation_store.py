"""OpenAI's conversations: items kept by the server across Responses API calls.

A conversation holds Responses input items, each with an id (messages, function calls and their
outputs, reasoning); a Responses call that names it (``conversation``) is given its items before
its own input, and once its answer is done its input and output items are added to it. Clients
also add, read and delete items directly (`conversations`). Kept in the server's memory, the most
recent ``capacity`` conversations (the least recently used is dropped first); how many are kept
is ``spyglass:conversations_kept``.
"""

import time
from dataclasses import dataclass, field

from spyglass.core.api.responses_schemas import InputItem

NOT_FOUND = "conversation_not_found"
"""The error code of a call naming a conversation the server does not keep."""


@dataclass(slots=True)
class Conversation:
    """A kept conversation: its id, creation time, metadata and items, oldest first."""

    id: str
    metadata: dict[str, str] = field(default_factory=dict)
    items: list[InputItem] = field(default_factory=list)
    created_at: int = field(default_factory=lambda: int(time.time()))

    def card(self) -> dict:
        """The conversation object the API returns."""
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }

    def item(self, item_id: str) -> InputItem | None:
        """The item ``item_id``, if the conversation has it."""
        return next((item for item in self.items if item.id == item_id), None)
