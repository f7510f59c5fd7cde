"""OpenAI's Conversations API: create a conversation (``POST /v1/conversations``), read, update
(``metadata``) and delete it, and add, list, read and delete its items. A Responses call that
names it continues it (`conversation_store`). A conversation the server does not keep is a 404.
"""

from typing import Annotated, Literal

import msgspec
from litestar import delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter
from msgspec import Meta

from spyglass.core.api.context import ServingContext
from spyglass.core.api.conversation_store import NOT_FOUND, Conversation
from spyglass.core.api.cursor_pages import CursorPage
from spyglass.core.api.errors import APIError
from spyglass.core.api.kept_ids import CONVERSATION, new_kept_id
from spyglass.core.api.response_items import image_urls_included, listed_item, page_of_items
from spyglass.core.api.response_store import with_ids
from spyglass.core.api.responses_schemas import InputItem
from spyglass.core.api.schemas import Metadata
from spyglass.core.api.validation import json_body_guard

MAX_ITEMS_ADDED = 20
"""Items one call may add (OpenAI's limit)."""

Items = Annotated[list[InputItem], Meta(max_length=MAX_ITEMS_ADDED)]
Include = Annotated[list[str] | None, QueryParameter(max_items=8)]


class ConversationCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations``: its first items and its metadata."""

    items: Items | None = None
    metadata: Metadata | None = None


class ConversationUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations/{id}``: its new metadata."""

    metadata: Metadata


class ItemsCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations/{id}/items``: the items to add, at its end."""

    items: Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_ITEMS_ADDED)]


@post(
    "/v1/conversations",
    summary="Create a conversation (OpenAI Conversations API)",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": ConversationCreate},
)
async def create_conversation(
    data: JSONBody[ConversationCreate], serving: NamedDependency[ServingContext]
) -> dict:
    """A new conversation holding ``items`` (each given an id), with ``metadata``."""
    store = serving.conversations
    if not store.capacity:
        message = "this server keeps no conversations: start it with --conversations-store-size N"
        raise APIError(400, message, code="unsupported_parameter")
    conversation = Conversation(
        new_kept_id(CONVERSATION, serving.options.response_id_tag),
        dict(data.metadata or {}),
        with_ids(list(data.items or ())),
    )
    store.put(conversation.id, conversation)
    return conversation.card()


@get(
    "/v1/conversations/{conversation_id:str}",
    summary="A conversation (OpenAI Conversations API)",
    tags=["openai"],
)
async def retrieve_conversation(
    conversation_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """The conversation object (its id, creation time and metadata)."""
    return kept_conversation(serving, conversation_id).card()


@post(
    "/v1/conversations/{conversation_id:str}",
    summary="Replace a conversation's metadata (OpenAI Conversations API)",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": ConversationUpdate},
)
async def update_conversation(
    conversation_id: FromPath[str],
    data: JSONBody[ConversationUpdate],
    serving: NamedDependency[ServingContext],
) -> dict:
    """The conversation with its metadata replaced by the body's."""
    conversation = kept_conversation(serving, conversation_id)
    conversation.metadata = dict(data.metadata)
    return conversation.card()


@delete(
    "/v1/conversations/{conversation_id:str}",
    summary="Delete a conversation (OpenAI Conversations API)",
    tags=["openai"],
    status_code=200,
)
async def delete_conversation(
    conversation_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """Drop the conversation and its items."""
    kept_conversation(serving, conversation_id)
    serving.conversations.delete(conversation_id)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@post(
    "/v1/conversations/{conversation_id:str}/items",
    summary="Add items to a conversation (OpenAI Conversations API)",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": ItemsCreate},
)
async def create_conversation_items(
    conversation_id: FromPath[str],
    data: JSONBody[ItemsCreate],
    serving: NamedDependency[ServingContext],
    include: Include = None,
) -> dict:
    """The items added at the conversation's end (each given an id), as a list."""
    image_urls = image_urls_included(include)
    conversation = kept_conversation(serving, conversation_id)
    added = with_ids(data.items)
    conversation.items.extend(added)
    page = CursorPage("asc", len(added))
    return page_of_items(tuple(added), page, image_urls)


@get(
    "/v1/conversations/{conversation_id:str}/items",
    summary="A conversation's items (OpenAI Conversations API)",
    tags=["openai"],
)
async def list_conversation_items(
    conversation_id: FromPath[str],
    serving: NamedDependency[ServingContext],
    limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], QueryParameter()] = "desc",
    after: Annotated[str | None, QueryParameter(max_length=256)] = None,
    include: Include = None,
) -> dict:
    """The conversation's items, newest first unless ``order`` is ``asc``, paged."""
    image_urls = image_urls_included(include)
    items = tuple(kept_conversation(serving, conversation_id).items)
    return page_of_items(items, CursorPage(order, limit, after), image_urls)


@get(
    "/v1/conversations/{conversation_id:str}/items/{item_id:str}",
    summary="One item of a conversation (OpenAI Conversations API)",
    tags=["openai"],
)
async def retrieve_conversation_item(
    conversation_id: FromPath[str],
    item_id: FromPath[str],
    serving: NamedDependency[ServingContext],
    include: Include = None,
) -> dict:
    """The item ``item_id``."""
    image_urls = image_urls_included(include)
    conversation = kept_conversation(serving, conversation_id)
    return listed_item(_kept_item(conversation, item_id), image_urls)


@delete(
    "/v1/conversations/{conversation_id:str}/items/{item_id:str}",
    summary="Delete an item of a conversation (OpenAI Conversations API)",
    tags=["openai"],
    status_code=200,
)
async def delete_conversation_item(
    conversation_id: FromPath[str], item_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """Drop the item; the conversation object."""
    conversation = kept_conversation(serving, conversation_id)
    conversation.items.remove(_kept_item(conversation, item_id))
    return conversation.card()


def kept_conversation(serving: ServingContext, conversation_id: str) -> Conversation:
    """The conversation ``conversation_id``; a 404 naming it when the server does not keep it."""
    return serving.conversations.require(conversation_id, "conversation_id", NOT_FOUND)


def _kept_item(conversation: Conversation, item_id: str) -> InputItem:
    item = conversation.item(item_id)
    if item is None:
        raise APIError(404, f"no item {item_id!r} in this conversation", "item_id")
    return item
