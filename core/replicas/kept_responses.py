"""Which replica a call about a kept Responses API response must reach: the one whose id it names.

Each replica names itself in the ids of the responses it makes (`response_ids`); the ingress reads
the id a call is about, from ``previous_response_id`` in a ``POST /v1/responses`` body or from a
``/v1/responses/{id}...`` path (read, stream, input items, cancel, delete), and the router sends
the call to that replica (`PrefixAffinityRouter`).
"""

from spyglass.core.api.response_ids import keeper_of
from spyglass.core.replicas.prefix import json_object

RESPONSES_PATH = "/v1/responses"


def response_keeper(method: str, path: str, body: bytes) -> str | None:
    """The replica tag of the response a call continues or is about; None for any other call."""
    if path.startswith(RESPONSES_PATH + "/"):
        response_id = path[len(RESPONSES_PATH) + 1 :].partition("/")[0]
        return keeper_of(response_id)
    if method == "POST" and path == RESPONSES_PATH:
        return keeper_of(json_object(body).get("previous_response_id"))
    return None
