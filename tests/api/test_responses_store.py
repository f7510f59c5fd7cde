"""Responses kept by the server: ``previous_response_id`` continues one as if its conversation had
been sent again, ``GET`` and ``DELETE /v1/responses/{id}`` read and drop one, and the oldest go
first. Through the official ``openai`` client."""

import httpx
import openai
import pytest

from spyglass.core.cli.main import build_parser
from spyglass.core.cli.serve_command import server_options_from_args
from tests.telemetry.test_answer_tracing import UNIT as CHAT_UNIT

GREEDY = {"model": "tiny", "temperature": 0, "max_output_tokens": 6}
# A unit is all a forced call may say: its arguments end, whatever the random model writes.
UNIT = {"type": "function", **CHAT_UNIT["function"]}  # the Responses API's flat shape


@pytest.fixture(scope="module")
def tiny_client(tiny_compact_server):
    """The compact-JSON server (forced calls end), keeping the default number of responses."""
    return openai.OpenAI(base_url=f"{tiny_compact_server.base_url}/v1", api_key="unused")


def _same_answer(a, b) -> None:
    assert a.usage.input_tokens == b.usage.input_tokens and a.output_text == b.output_text


def test_a_continuation_is_the_conversation_sent_again(tiny_client):
    first = tiny_client.responses.create(instructions="Be brief.", input="Name a city.", **GREEDY)
    assert first.store is True
    kept = tiny_client.responses.retrieve(first.id)
    assert (kept.id, kept.output_text, kept.usage) == (first.id, first.output_text, first.usage)
    follow = tiny_client.responses.create(
        input="And another?", previous_response_id=first.id, **GREEDY
    )
    assert follow.previous_response_id == first.id
    # The same as sending the turns (the first call's instructions are not carried over).
    explicit = tiny_client.responses.create(
        input=[
            {"role": "user", "content": "Name a city."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And another?"},
        ],
        store=False,
        **GREEDY,
    )
    _same_answer(follow, explicit)
    # And a continuation of the continuation holds all three turns.
    third = tiny_client.responses.create(
        input="Last one.", previous_response_id=follow.id, **GREEDY
    )
    assert third.usage.input_tokens > follow.usage.input_tokens + follow.usage.output_tokens


def test_a_function_call_is_answered_by_continuing_its_response(tiny_client):
    asked = tiny_client.responses.create(
        input="Which unit?",
        tools=[UNIT],
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY | {"max_output_tokens": 40},
    )
    (call,) = [item for item in asked.output if item.type == "function_call"]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24C"}
    follow = tiny_client.responses.create(
        input=[result], previous_response_id=asked.id, tools=[UNIT], **GREEDY
    )
    made = {"type": "function_call", "call_id": call.call_id, "name": call.name}
    explicit = tiny_client.responses.create(
        input=[
            {"role": "user", "content": "Which unit?"},
            made | {"arguments": call.arguments},
            result,
        ],
        tools=[UNIT],
        store=False,
        **GREEDY,
    )
    _same_answer(follow, explicit)
    # Its input items: the question, the call (by its output item's id), the result.
    _, listed_call, answered = tiny_client.responses.input_items.list(follow.id, order="asc").data
    assert (listed_call.type, listed_call.id, listed_call.call_id) == (
        "function_call",
        call.id,
        call.call_id,
    )
    assert (listed_call.name, listed_call.arguments) == (call.name, call.arguments)
    assert (answered.type, answered.call_id, answered.output) == (
        "function_call_output",
        call.call_id,
        "Sunny, 24C",
    )
    assert answered.id.startswith("fco_")


def test_streamed_responses_are_kept_and_unkept_ones_are_not(tiny_client):
    events = list(tiny_client.responses.create(input="Stream it.", stream=True, **GREEDY))
    streamed = events[-1].response  # completed, or incomplete at max_output_tokens
    assert tiny_client.responses.retrieve(streamed.id).output_text == streamed.output_text
    unkept = tiny_client.responses.create(input="Forget it.", store=False, **GREEDY)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        tiny_client.responses.retrieve(unkept.id)


def test_a_deleted_response_is_gone_and_cannot_be_continued(tiny_client):
    kept = tiny_client.responses.create(input="Keep it.", **GREEDY)
    deleted = httpx.delete(f"{tiny_client.base_url}responses/{kept.id}", timeout=30)
    assert deleted.json() == {"id": kept.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        tiny_client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        tiny_client.responses.delete(kept.id)
    with pytest.raises(openai.BadRequestError) as error:
        tiny_client.responses.create(input="More.", previous_response_id=kept.id, **GREEDY)
    assert error.value.body["code"] == "previous_response_not_found"
    assert error.value.body["param"] == "previous_response_id"


def test_the_oldest_go_first_and_a_server_may_keep_none(tiny_llama_dir, server_factory):
    one = server_factory(
        str(tiny_llama_dir), "--served-model-name", "tiny", "--responses-store-size", "1"
    )
    client = openai.OpenAI(base_url=f"{one.base_url}/v1", api_key="unused")
    older = client.responses.create(input="First.", **GREEDY)
    newer = client.responses.create(input="Second.", **GREEDY)
    assert client.responses.retrieve(newer.id).id == newer.id
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(older.id)
    assert "spyglass:responses_kept 1.0" in httpx.get(f"{one.base_url}/metrics").text
    none = server_factory(
        str(tiny_llama_dir), "--served-model-name", "tiny", "--responses-store-size", "0"
    )
    client = openai.OpenAI(base_url=f"{none.base_url}/v1", api_key="unused")
    assert client.responses.create(input="Hi.", **GREEDY).store is False
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(input="Hi.", store=True, **GREEDY)
    assert error.value.body["param"] == "store"


def test_each_replica_keeps_its_own_responses_and_conversations():
    # The router sends what follows a response or a conversation to the replica that keeps it
    # (tests/replicas).
    for flags, kept in (
        (["--replicas", "2"], 256),
        (["--replicas", "2", "--responses-store-size", "8"], 8),
        ([], 256),
    ):
        argv = ["serve", *flags]
        options = server_options_from_args(build_parser(argv).parse_args(argv))
        assert (options.responses_store_size, options.response_id_tag) == (kept, "")
        assert options.conversations_store_size == 256


def test_input_items_list_the_conversation_a_response_was_given(tiny_client):
    first = tiny_client.responses.create(input="Name a city.", **GREEDY)
    (asked,) = tiny_client.responses.input_items.list(first.id).data
    assert (asked.type, asked.role, asked.id.startswith("msg_")) == ("message", "user", True)
    assert [(part.type, part.text) for part in asked.content] == [("input_text", "Name a city.")]
    follow = tiny_client.responses.create(
        input=[{"role": "user", "content": "And another?", "id": "msg_mine"}],
        previous_response_id=first.id,
        **GREEDY,
    )
    # The turns it continued (the first call's input and answer, by their ids), then its own.
    listed = tiny_client.responses.input_items.list(follow.id, order="asc").data
    answer = next(item for item in first.output if item.type == "message")
    assert [item.id for item in listed] == [asked.id, answer.id, "msg_mine"]
    assert listed[1].role == "assistant" and listed[1].content[0].type == "output_text"
    assert listed[1].content[0].text == first.output_text
    # Newest first by default, in pages.
    page = tiny_client.responses.input_items.list(follow.id, limit=2)
    assert [item.id for item in page.data] == ["msg_mine", answer.id] and page.has_more
    rest = tiny_client.responses.input_items.list(follow.id, limit=2, after=answer.id)
    assert [item.id for item in rest.data] == [asked.id] and not rest.has_more
    url = f"{tiny_client.base_url}responses/{follow.id}/input_items"
    refused = httpx.get(url, params={"include": "reasoning.encrypted_content"}, timeout=30)
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "include")
    assert httpx.get(url, params={"limit": 0}, timeout=30).status_code == 400
    for asked in ({"include": "message.output_text.logprobs"}, {"include_obfuscation": "true"}):
        refused = httpx.get(
            f"{tiny_client.base_url}responses/{follow.id}", params=asked, timeout=30
        )
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, *asked)
    with pytest.raises(openai.NotFoundError):
        tiny_client.responses.input_items.list("resp_unknown")
