"""OpenAI's stored chat completions (``store: true``): read back as they were returned (a streamed
one as its chunks add up, equal to the same call unstreamed), listed by model and metadata and
paged, their messages listed, their metadata replaced, dropped; the oldest go first. Through the
official ``openai`` client."""

import subprocess
import sys
import uuid

import httpx
import openai
import pytest

from spyglass.core.cli.main import build_parser
from spyglass.core.cli.serve_command import server_options_from_args
from tests.telemetry.test_answer_tracing import UNIT

GREEDY = {"model": "tiny", "temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def client(tiny_compact_server):
    """The compact-JSON server (forced calls end), keeping the default number of completions."""
    return openai.OpenAI(
        base_url=f"{tiny_compact_server.base_url}/v1", api_key="unused", max_retries=0
    )


def _tag() -> dict:
    """Metadata no other test's completions carry: the server is shared."""
    return {"test": uuid.uuid4().hex}


def test_a_stored_completion_is_read_updated_and_deleted(client):
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Name "}, {"type": "text", "text": "a city."}],
        },
    ]
    tag = _tag()
    made = client.chat.completions.create(messages=messages, store=True, metadata=tag, **GREEDY)
    kept = client.chat.completions.retrieve(made.id)
    assert kept.model_dump() == {**made.model_dump(), "metadata": tag}
    listed = client.chat.completions.messages.list(made.id).data
    assert [(m.id, m.role, m.content) for m in listed] == [
        (f"{made.id}-0", "system", "Be brief."),
        (f"{made.id}-1", "user", "Name a city."),
    ]
    assert [part.text for part in listed[1].content_parts] == ["Name ", "a city."]
    newer = client.chat.completions.update(made.id, metadata={"reviewed": "yes"})
    assert (
        newer.metadata == {"reviewed": "yes"} == client.chat.completions.retrieve(made.id).metadata
    )
    assert client.chat.completions.delete(made.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.delete(made.id)
    unstored = client.chat.completions.create(messages=messages, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(unstored.id)


def test_a_streamed_completion_is_kept_as_the_same_call_unstreamed(client):
    asked = {
        "messages": [{"role": "user", "content": "Count to three."}],
        "logprobs": True,
        "top_logprobs": 2,
        "n": 2,
        "seed": 1,
        **GREEDY,
    }
    stream = client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, store=True, **asked
    )
    (streamed_id,) = {chunk.id for chunk in stream}  # read to its end
    kept = client.chat.completions.retrieve(streamed_id)
    whole = client.chat.completions.create(**asked)
    # (The second call reads the first one's prompt from the prefix cache: its usage says so.)
    counts = lambda usage: (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    assert counts(kept.usage) == counts(whole.usage)
    for kept_choice, choice in zip(kept.choices, whole.choices, strict=True):
        assert kept_choice.message.content == choice.message.content
        assert kept_choice.finish_reason == choice.finish_reason
        assert kept_choice.logprobs.content == choice.logprobs.content
    # A forced call: its arguments, streamed in pieces, are kept whole.
    forced = {
        "messages": [{"role": "user", "content": "Convert 3 km."}],
        "tools": [UNIT],
        "tool_choice": "required",
        "parallel_tool_calls": False,  # one call, then the answer ends
        **{**GREEDY, "max_tokens": 60},
    }
    stream = client.chat.completions.create(stream=True, store=True, **forced)
    (streamed_id,) = {chunk.id for chunk in stream}
    kept = client.chat.completions.retrieve(streamed_id)
    whole = client.chat.completions.create(**forced)
    calls = lambda completion: [
        (call.function.name, call.function.arguments)
        for call in completion.choices[0].message.tool_calls
    ]
    assert calls(kept) == calls(whole) and calls(whole)
    assert kept.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"


def test_the_list_filters_by_model_and_metadata_and_pages(client):
    tag = _tag()
    ask = {"messages": [{"role": "user", "content": "Hi."}], **GREEDY}
    made = [
        client.chat.completions.create(store=True, metadata={**tag, "kind": kind}, **ask).id
        for kind in ("a", "b", "a")
    ]
    client.chat.completions.create(metadata={**tag, "kind": "a"}, **ask)  # not stored
    assert [c.id for c in client.chat.completions.list(metadata=tag, limit=100)] == made
    of_a = client.chat.completions.list(metadata={**tag, "kind": "a"}, limit=100).data
    assert [c.id for c in of_a] == [made[0], made[2]]
    assert all(c.metadata["kind"] == "a" for c in of_a)
    first = client.chat.completions.list(metadata=tag, limit=1, order="desc")
    assert ([c.id for c in first.data], first.has_more) == ([made[2]], True)
    # The client's iterator follows `after` through the pages.
    paged = client.chat.completions.list(metadata=tag, limit=1, order="desc")
    assert [c.id for c in paged] == made[::-1]
    assert client.chat.completions.list(metadata=tag, model="another").data == []
    assert [c.id for c in client.chat.completions.list(metadata=tag, model="tiny")] == made
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.list(after="chatcmpl-unknown")
    assert error.value.body["param"] == "after"


def test_the_oldest_go_first_and_a_server_may_keep_none(tiny_llama_dir, server_factory):
    two = server_factory(
        str(tiny_llama_dir), "--served-model-name", "tiny", "--chat-completions-store-size", "2"
    )
    client = openai.OpenAI(base_url=f"{two.base_url}/v1", api_key="unused")
    ask = {"messages": [{"role": "user", "content": "Hi."}], "store": True, **GREEDY}
    ids = [client.chat.completions.create(**ask).id for _ in range(3)]
    assert [c.id for c in client.chat.completions.list()] == ids[1:]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(ids[0])
    assert "spyglass:chat_completions_kept 2.0" in httpx.get(f"{two.base_url}/metrics").text
    none = server_factory(
        str(tiny_llama_dir), "--served-model-name", "tiny", "--chat-completions-store-size", "0"
    )
    client = openai.OpenAI(base_url=f"{none.base_url}/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**ask)
    assert error.value.body["param"] == "store"
    assert client.chat.completions.create(**{**ask, "store": False}).choices


def test_replicas_keep_no_chat_completions():
    # Each replica would keep its own: a list could show one replica's only.
    serve = [sys.executable, "-m", "spyglass.core.cli.main", "serve", "--replicas", "2"]
    refused = subprocess.run(
        [*serve, "--chat-completions-store-size", "8"], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "--chat-completions-store-size" in refused.stderr
    for flags, kept in ((["--replicas", "2"], 0), ([], 256)):
        argv = ["serve", *flags]
        options = server_options_from_args(build_parser(argv).parse_args(argv))
        assert options.chat_completions_store_size == kept
