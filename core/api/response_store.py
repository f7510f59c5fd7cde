"""The Responses API's stored responses: what ``previous_response_id`` continues and
``GET /v1/responses/{id}`` returns.

Kept in the server's memory, the most recent ``capacity`` of them (the oldest is dropped first):
a continuation of a dropped or unknown response is a 400 naming ``previous_response_id``, as
OpenAI answers one it does not have. Each keeps the response object the client got and the
conversation it ended, as Responses input items: the items it continued, its own input, and its
output (messages and function calls; reasoning is not carried into a continuation). Its
``instructions`` are not: a continuation gives its own, as OpenAI's do. How many are kept is
``spyglass:responses_kept``.
"""

from collections import OrderedDict
from dataclasses import dataclass

from spyglass.core.api.responses_schemas import InputItem
from spyglass.telemetry import metrics


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A stored response: the object the client got, and its conversation as input items."""

    response: dict
    items: tuple[InputItem, ...]


class ResponseStore:
    """The last ``capacity`` stored responses, by id."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored``, dropping the oldest beyond the capacity."""
        self._responses[stored.response["id"]] = stored
        while len(self._responses) > self.capacity:
            self._responses.popitem(last=False)
        metrics.RESPONSES_KEPT.set(len(self._responses))

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response ``response_id``, if it is still kept."""
        return self._responses.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Drop the response ``response_id``; whether it was kept."""
        kept = self._responses.pop(response_id, None) is not None
        metrics.RESPONSES_KEPT.set(len(self._responses))
        return kept


def output_items(output: list[dict]) -> list[InputItem]:
    """A response's output items as the input items that continue it: its messages' text and
    its function calls (reasoning items are left out)."""
    items = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            items.append(InputItem(type="message", role="assistant", content=text))
        elif item["type"] == "function_call":
            items.append(
                InputItem(
                    type="function_call",
                    call_id=item["call_id"],
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
    return items
