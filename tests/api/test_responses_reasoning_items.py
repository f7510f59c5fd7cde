"""Reasoning items sent back to the Responses API: with ``include: ["reasoning.encrypted_content"]``
an answer's reasoning comes back as a blob a stateless client (``store: false``) returns, and a
reasoning item sent back, as text or blob, reaches the template as the next assistant turn's
``reasoning_content``; a blob this server did not write is a 400 naming ``input``."""

import pytest
from litestar.testing import TestClient

from spyglass.core.api.app import create_app
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig

# Renders each assistant turn's reasoning before its text, as Qwen3's template does.
TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.reasoning_content %}"
    "<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
BASE = {"model": "tiny", "temperature": 0, "max_output_tokens": 8, "store": False}


@pytest.fixture(scope="module")
def client(tiny_llama_dir):
    # deepseek_r1: the answer starts in the reasoning, so the random model's output is all of it.
    config = EngineConfig(
        model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1, chat_template=TEMPLATE
    )
    options = ServerOptions(served_model_name="tiny", reasoning_parser="deepseek_r1")
    with TestClient(create_app(config, options)) as http:
        yield http


def _input_tokens(client, items: list) -> int:
    reply = client.post("/v1/responses", json=BASE | {"input": items})
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["input_tokens"]


def test_a_reasoning_item_round_trips_as_text_or_blob(client):
    asked = client.post(
        "/v1/responses",
        json=BASE | {"input": "Why?", "include": ["reasoning.encrypted_content"]},
    ).json()
    (thought,) = asked["output"]
    assert thought["type"] == "reasoning" and thought["content"][0]["text"]
    assert thought["encrypted_content"].startswith("spyglass-reasoning-v1:")
    question = {"role": "user", "content": "Why?"}
    answered = {"role": "assistant", "content": "Because."}
    follow = {"role": "user", "content": "And then?"}
    as_blob = {"type": "reasoning", "id": thought["id"], "summary": [],
               "encrypted_content": thought["encrypted_content"]}  # fmt: skip
    as_text = {"type": "reasoning", "summary": [], "content": thought["content"]}
    without = _input_tokens(client, [question, answered, follow])
    with_blob = _input_tokens(client, [question, as_blob, answered, follow])
    with_text = _input_tokens(client, [question, as_text, answered, follow])
    # The template shows the reasoning with the answer it came before: the same from either form.
    assert with_blob == with_text > without
    # An answer that only reasoned is a turn of its own, its reasoning alone.
    assert _input_tokens(client, [question, as_blob, follow]) > _input_tokens(
        client, [question, follow]
    )


def test_a_blob_from_elsewhere_is_a_400(client):
    foreign = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABo-opaque"}
    reply = client.post(
        "/v1/responses", json=BASE | {"input": [{"role": "user", "content": "Hi"}, foreign]}
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input"
    assert "not written by this server" in reply.json()["error"]["message"]


def test_a_continuation_carries_the_reasoning(client):
    first = client.post("/v1/responses", json=BASE | {"input": "Why?", "store": True}).json()
    thought = first["output"][0]["content"][0]["text"]
    follow = client.post(
        "/v1/responses",
        json=BASE | {"input": "And then?", "previous_response_id": first["id"], "store": True},
    ).json()
    explicit = [
        {"role": "user", "content": "Why?"},
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": thought}],
        },
        {"role": "user", "content": "And then?"},
    ]
    assert follow["usage"]["input_tokens"] == _input_tokens(client, explicit)
    listed = client.get(f"/v1/responses/{follow['id']}/input_items?order=asc").json()["data"]
    assert [item["type"] for item in listed] == ["message", "reasoning", "message"]
    assert listed[1]["id"] == first["output"][0]["id"]
    assert listed[1]["content"] == [{"type": "reasoning_text", "text": thought}]
