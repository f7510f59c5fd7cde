"""OpenAI's stored chat completions' routes: list them (``GET /v1/chat/completions``, by
``model`` and ``metadata[key]=value``), read one (``GET .../{id}``) and the messages it was sent
(``GET .../{id}/messages``), replace its ``metadata`` (``POST .../{id}``) and drop it
(``DELETE .../{id}``). A completion the server does not keep is a 404."""

from typing import Annotated, Literal

import msgspec
from litestar import Request, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter

from spyglass.core.api.chat_store import listed_message
from spyglass.core.api.context import ServingContext
from spyglass.core.api.cursor_pages import CursorPage, page_of
from spyglass.core.api.schemas import Metadata
from spyglass.core.api.validation import json_body_guard

Limit = Annotated[int, QueryParameter(ge=1, le=100)]
Order = Annotated[Literal["asc", "desc"], QueryParameter()]
After = Annotated[str | None, QueryParameter(max_length=256)]


class MetadataUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/chat/completions/{id}``: the completion's new ``metadata`` (only it can change)."""

    metadata: Metadata | None


@get("/v1/chat/completions", summary="Stored chat completions", tags=["openai"])
async def list_chat_completions(
    request: Request,
    serving: NamedDependency[ServingContext],
    model: Annotated[str | None, QueryParameter(max_length=256)] = None,
    limit: Limit = 20,
    order: Order = "asc",
    after: After = None,
) -> dict:
    """The kept completions (made with ``store: true``), oldest first unless ``order`` is ``desc``;
    only those of ``model`` and carrying every ``metadata[key]=value`` pair the query gives."""
    metadata = {
        key[len("metadata[") : -1]: value
        for key, value in request.query_params.items()
        if key.startswith("metadata[") and key.endswith("]")
    }
    kept = [c for c in serving.chat_completions.entries() if c.matches(model, metadata)]
    page = CursorPage(order, limit, after)
    where = "stored chat completion {!r} among those listed"
    return page_of(kept, page, lambda stored: stored.id, lambda stored: stored.completion, where)


@get(
    "/v1/chat/completions/{completion_id:str}",
    summary="A stored chat completion",
    tags=["openai"],
)
async def retrieve_chat_completion(
    completion_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """The completion as it was returned (a streamed one as its chunks add up), with its metadata."""
    return serving.chat_completions.require(completion_id, "completion_id").completion


@get(
    "/v1/chat/completions/{completion_id:str}/messages",
    summary="The messages of a stored chat completion",
    tags=["openai"],
)
async def list_chat_completion_messages(
    completion_id: FromPath[str],
    serving: NamedDependency[ServingContext],
    limit: Limit = 20,
    order: Order = "asc",
    after: After = None,
) -> dict:
    """The messages the completion was sent, each with an id, in order unless ``order`` is ``desc``."""
    messages = [
        listed_message(completion_id, index, message)
        for index, message in enumerate(
            serving.chat_completions.require(completion_id, "completion_id").messages
        )
    ]
    where = "message {!r} in this chat completion"
    return page_of(messages, CursorPage(order, limit, after), lambda m: m["id"], dict, where)


@post(
    "/v1/chat/completions/{completion_id:str}",
    summary="Replace a stored chat completion's metadata",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": MetadataUpdate},
)
async def update_chat_completion(
    completion_id: FromPath[str],
    data: JSONBody[MetadataUpdate],
    serving: NamedDependency[ServingContext],
) -> dict:
    """The completion with its ``metadata`` replaced by the body's (``null`` empties it)."""
    stored = serving.chat_completions.require(completion_id, "completion_id")
    stored.completion["metadata"] = dict(data.metadata or {})
    return stored.completion


@delete(
    "/v1/chat/completions/{completion_id:str}",
    summary="Delete a stored chat completion",
    tags=["openai"],
    status_code=200,
)
async def delete_chat_completion(
    completion_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """Drop the completion: ``{"id", "object": "chat.completion.deleted", "deleted": true}``."""
    serving.chat_completions.require(completion_id, "completion_id")
    serving.chat_completions.delete(completion_id)
    return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True}
