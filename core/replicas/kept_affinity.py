"""Which replica a call about something a replica keeps must reach: the one whose id it names.

Each replica names itself in the ids of the Responses API responses and conversations it makes
(`kept_ids`); the ingress reads the id a call is about, from a ``POST /v1/responses`` body's
``previous_response_id`` or ``conversation``, or from a ``/v1/responses/{id}...`` or
``/v1/conversations/{id}...`` path (read, stream, items, cancel, delete), and the router sends the
call to that replica (`PrefixAffinityRouter`).
"""

from spyglass.core.api.kept_ids import keeper_of
from spyglass.core.replicas.prefix import json_object

RESPONSES_PATH = "/v1/responses"
KEPT_PATHS = (RESPONSES_PATH + "/", "/v1/conversations/")


def kept_keeper(method: str, path: str, body: bytes) -> str | None:
    """The replica tag of the response or conversation a call continues or is about; None for
    any other call."""
    for kept_path in KEPT_PATHS:
        if path.startswith(kept_path):
            return keeper_of(path[len(kept_path) :].partition("/")[0])
    if method != "POST" or path != RESPONSES_PATH:
        return None
    request = json_object(body)
    conversation = request.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return keeper_of(request.get("previous_response_id")) or keeper_of(conversation)
