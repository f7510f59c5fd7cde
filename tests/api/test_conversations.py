"""OpenAI's Conversations API, through the official ``openai`` client: a Responses call that names
a conversation is answered as if its items were sent first, and its input and answer join the
conversation; items are added, listed, read and deleted; the conversation's metadata is replaced
and the conversation dropped; the least recently used go first."""

import httpx
import openai
import pytest

GREEDY = {"model": "tiny", "temperature": 0, "max_output_tokens": 6}


@pytest.fixture(scope="module")
def client(tiny_compact_server):
    return openai.OpenAI(
        base_url=f"{tiny_compact_server.base_url}/v1", api_key="unused", max_retries=0
    )


def _said(items) -> list[tuple[str, str]]:
    """Each message item's role and text."""
    return [
        (item.role, "".join(part.text for part in item.content))
        for item in items
        if item.type == "message"
    ]


def test_a_response_in_a_conversation_sees_its_items_and_joins_them(client):
    conversation = client.conversations.create(
        items=[{"role": "user", "content": "My name is Ada."}], metadata={"topic": "names"}
    )
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "names"}
    first = client.responses.create(
        input="What is my name?", conversation=conversation.id, **GREEDY
    )
    assert first.conversation.id == conversation.id
    # The same answer as the conversation's items sent before the input.
    explicit = client.responses.create(
        input=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "user", "content": "What is my name?"},
        ],
        **GREEDY,
    )
    assert first.output_text == explicit.output_text
    assert first.usage.input_tokens == explicit.usage.input_tokens
    # The input and the answer joined the conversation, in order, under the answer's item id.
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert _said(items) == [
        ("user", "My name is Ada."),
        ("user", "What is my name?"),
        ("assistant", first.output_text),
    ]
    assert items[-1].id == next(item.id for item in first.output if item.type == "message")
    second = client.responses.create(
        input="Say it again.", conversation={"id": conversation.id}, **GREEDY
    )
    third_turn = [
        *[{"role": role, "content": text} for role, text in _said(items)],
        {"role": "user", "content": "Say it again."},
    ]
    assert second.output_text == client.responses.create(input=third_turn, **GREEDY).output_text
    assert len(client.conversations.items.list(conversation.id).data) == 5


def test_items_are_added_read_listed_and_deleted(client):
    conversation = client.conversations.create()
    assert client.conversations.items.list(conversation.id).data == []
    added = client.conversations.items.create(
        conversation.id,
        items=[
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"type": "function_call_output", "call_id": "call_1", "output": "three"},
        ],
    ).data
    assert [item.type for item in added] == ["message", "message", "function_call_output"]
    newest_first = client.conversations.items.list(conversation.id, limit=2)
    assert [item.id for item in newest_first.data] == [added[2].id, added[1].id]
    assert newest_first.has_more
    # The client's iterator follows `after` through the pages.
    assert [item.id for item in client.conversations.items.list(conversation.id, limit=1)] == [
        item.id for item in reversed(added)
    ]
    one = client.conversations.items.retrieve(added[0].id, conversation_id=conversation.id)
    assert _said([one]) == [("user", "one")]
    after = client.conversations.items.delete(added[1].id, conversation_id=conversation.id)
    assert after.id == conversation.id
    left = client.conversations.items.list(conversation.id, order="asc").data
    assert [item.id for item in left] == [added[0].id, added[2].id]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(added[1].id, conversation_id=conversation.id)


def test_a_conversation_is_updated_and_deleted(client):
    conversation = client.conversations.create(metadata={"a": "1"})
    assert client.conversations.retrieve(conversation.id).metadata == {"a": "1"}
    updated = client.conversations.update(conversation.id, metadata={"b": "2"})
    assert updated.metadata == {"b": "2"} == client.conversations.retrieve(conversation.id).metadata
    deleted = client.conversations.delete(conversation.id)
    assert (deleted.id, deleted.deleted) == (conversation.id, True)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(input="Hi.", conversation=conversation.id, **GREEDY)
    assert error.value.body["param"] == "conversation"
    kept = client.conversations.create()
    previous = client.responses.create(input="Hi.", **GREEDY)
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(
            input="Hi.", conversation=kept.id, previous_response_id=previous.id, **GREEDY
        )
    assert error.value.body["param"] == "conversation"


def test_the_least_recently_used_go_first_and_a_server_may_keep_none(
    tiny_llama_dir, server_factory
):
    two = server_factory(
        str(tiny_llama_dir), "--served-model-name", "tiny", "--conversations-store-size", "2"
    )
    client = openai.OpenAI(base_url=f"{two.base_url}/v1", api_key="unused")
    first, second = (client.conversations.create() for _ in range(2))
    client.responses.create(input="Hi.", conversation=first.id, **GREEDY)  # first: used last
    client.conversations.create()
    assert client.conversations.retrieve(first.id).id == first.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(second.id)
    assert "spyglass:conversations_kept 2.0" in httpx.get(f"{two.base_url}/metrics").text
    none = server_factory(
        str(tiny_llama_dir), "--served-model-name", "tiny", "--conversations-store-size", "0"
    )
    client = openai.OpenAI(base_url=f"{none.base_url}/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError):
        client.conversations.create()
