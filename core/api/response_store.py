"""The Responses API's stored responses: what ``previous_response_id`` continues and
``GET /v1/responses/{id}`` (and ``.../input_items``) return.

Kept in the server's memory, the most recent ``capacity`` of them (the oldest is dropped first):
a continuation of a dropped or unknown response is a 400 naming ``previous_response_id``, as
OpenAI answers one it does not have. Each keeps the response object the client got and the
conversation it was given, as Responses input items, each with an id: the items it continued,
then its own input. Its conversation as a continuation sees it adds its output (reasoning,
messages and function calls; reasoning reaches the template as the next assistant turn's
``reasoning_content``). Its ``instructions`` are not kept in the conversation: a continuation
gives its own, as OpenAI's do. How many are kept is
``spyglass:responses_kept``.
"""

import uuid
from dataclasses import dataclass

import msgspec

from spyglass.core.api.responses_schemas import InputItem, ReasoningText


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A stored response: the object the client got, and the input items it was given."""

    response: dict
    inputs: tuple[InputItem, ...]

    @property
    def conversation(self) -> tuple[InputItem, ...]:
        """What a continuation of it sends before its own input: its inputs, then its output."""
        return (*self.inputs, *output_items(self.response["output"]))


# The prefix of a generated item id, by item type (as OpenAI's ids begin).
_ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def with_ids(items: list[InputItem]) -> list[InputItem]:
    """``items``, each with an ``id``: the client's where it gave one, else a new one."""
    return [
        item
        if item.id is not None
        else msgspec.structs.replace(item, id=f"{_ID_PREFIXES[item.type]}_{uuid.uuid4().hex}")
        for item in items
    ]


def output_items(output: list[dict]) -> list[InputItem]:
    """A response's output items as the input items that continue it, with their ids: its
    reasoning, its messages' text and its function calls."""
    items = []
    for item in output:
        if item["type"] == "reasoning":
            thought = [ReasoningText(part["text"]) for part in item["content"]]
            items.append(InputItem(type="reasoning", content=thought, id=item["id"]))
        elif item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            items.append(InputItem(type="message", role="assistant", content=text, id=item["id"]))
        elif item["type"] == "function_call":
            items.append(
                InputItem(
                    type="function_call",
                    call_id=item["call_id"],
                    name=item["name"],
                    arguments=item["arguments"],
                    id=item["id"],
                )
            )
    return items
