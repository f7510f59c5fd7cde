"""Ids of what the server keeps for later calls (Responses API responses and conversations):
``resp_<hex>`` and ``conv_<hex>``, or ``resp_<keeper>_<hex>`` and ``conv_<keeper>_<hex>``.

A server that is one of several behind a router (``spyglass serve --replicas``) names itself in
the ids it makes (`ServerOptions.response_id_tag`), so that the router can send every call about
a kept response or conversation (a continuation, a read, a new item) to the replica keeping it.
"""

import uuid

RESPONSE = "resp_"
CONVERSATION = "conv_"


def safe_tag(name: str) -> str:
    """``name`` as an id part: letters and digits as they are, anything else as its UTF-8 hex."""
    return name if name.isascii() and name.isalnum() else name.encode().hex()


def new_kept_id(prefix: str, keeper: str = "") -> str:
    """A fresh id of ``prefix`` (`RESPONSE` or `CONVERSATION`); with ``keeper`` (a `safe_tag`)
    it names the server that makes and keeps it."""
    random_part = uuid.uuid4().hex
    return f"{prefix}{keeper}_{random_part}" if keeper else f"{prefix}{random_part}"


def keeper_of(kept_id: object) -> str | None:
    """The keeper a `new_kept_id` named; None for an id without one, or anything else."""
    prefix = next((p for p in (RESPONSE, CONVERSATION) if str(kept_id).startswith(p)), None)
    if not isinstance(kept_id, str) or prefix is None:
        return None
    keeper, _, random_part = kept_id[len(prefix) :].partition("_")
    return keeper if keeper and random_part and safe_tag(keeper) == keeper else None
