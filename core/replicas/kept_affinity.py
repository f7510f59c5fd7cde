"""Which replica a call about something a replica keeps must reach: the one whose id it names.

Each replica names itself in the ids of the Responses API responses and conversations it makes
(`kept_ids`); the ingress reads the id a call is about, from the ``previous_response_id`` or
``conversation`` of a ``POST /v1/responses`` body (or of a count of its input tokens), or from a
``/v1/responses/{id}...`` or ``/v1/conversations/{id}...`` path (read, stream, items, cancel,
delete), and the router sends the call to that replica (`PrefixAffinityRouter`).
"""

from spyglass.core.api.kept_ids import keeper_of
from spyglass.core.replicas.prefix import json_object

RESPONSES_PATH = "/v1/responses"
KEPT_PATHS = (RESPONSES_PATH + "/", "/v1/conversations/")
CONTINUING_PATHS = (RESPONSES_PATH, RESPONSES_PATH + "/input_tokens")
"""The calls whose body names what they continue: a response, and the count of its input."""


def kept_keeper(method: str, path: str, body: bytes) -> str | None:
    """The replica tag of the response or conversation a call continues or is about; None for
    any other call."""
    if method == "POST" and path in CONTINUING_PATHS:
        return _continued_keeper(json_object(body))
    for kept_path in KEPT_PATHS:
        if path.startswith(kept_path):
            return keeper_of(path[len(kept_path) :].partition("/")[0])
    return None


def _continued_keeper(request: dict) -> str | None:
    """The keeper of the response or conversation a Responses body continues."""
    conversation = request.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return keeper_of(request.get("previous_response_id")) or keeper_of(conversation)
