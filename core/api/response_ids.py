"""Responses API ids, and the server that keeps each: ``resp_<hex>``, or ``resp_<keeper>_<hex>``.

A server that is one of several behind a router (``spyglass serve --replicas``) names itself in
the ids it makes (`ServerOptions.response_id_tag`), so that the router can send a continuation
(``previous_response_id``) and the stored-response routes to the replica that keeps the response.
"""

import uuid

PREFIX = "resp_"


def safe_tag(name: str) -> str:
    """``name`` as an id part: letters and digits as they are, anything else as its UTF-8 hex."""
    return name if name.isascii() and name.isalnum() else name.encode().hex()


def new_response_id(keeper: str = "") -> str:
    """A fresh id; with ``keeper`` (a `safe_tag`) it names the server that makes and keeps it."""
    random_part = uuid.uuid4().hex
    return f"{PREFIX}{keeper}_{random_part}" if keeper else f"{PREFIX}{random_part}"


def keeper_of(response_id: object) -> str | None:
    """The keeper a `new_response_id` named; None for an id without one, or anything else."""
    if not isinstance(response_id, str) or not response_id.startswith(PREFIX):
        return None
    keeper, _, random_part = response_id[len(PREFIX) :].partition("_")
    return keeper if keeper and random_part and safe_tag(keeper) == keeper else None
