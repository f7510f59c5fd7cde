"""Anthropic's Messages API through the official ``anthropic`` client, against the real default model."""

import json
from typing import Literal

import anthropic
import jsonschema
import pydantic
import pytest

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Rome?"}]


@pytest.fixture(scope="module")
def client(real_server):
    return anthropic.Anthropic(
        base_url=real_server.base_url, api_key="unused", max_retries=0, timeout=120
    )


def test_message_with_system_and_usage(client):
    message = client.messages.create(
        model=MODEL,
        max_tokens=24,
        system="Answer in one short sentence.",
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert (
        message.type == "message" and message.role == "assistant" and message.id.startswith("msg")
    )
    assert message.content[0].type == "text" and "Paris" in message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    usage = message.usage  # the prompt: computed afresh, and read from the prefix cache
    assert usage.input_tokens + usage.cache_read_input_tokens > 10 and 0 < usage.output_tokens <= 24


def test_usage_splits_the_prompt_read_from_the_prefix_cache(client):
    system = "You answer questions about European capitals. " * 12
    options = dict(
        model=MODEL,
        max_tokens=4,
        system=system,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "What is the capital of Spain?"}],
    )
    first = client.messages.create(**options).usage
    again = client.messages.create(**options).usage
    prompt = first.input_tokens + first.cache_read_input_tokens
    # The repeat's shared prompt comes from the cache; Anthropic counts it apart from input.
    assert again.input_tokens + again.cache_read_input_tokens == prompt
    assert again.cache_read_input_tokens >= 64 and again.input_tokens < prompt / 2
    assert again.cache_creation_input_tokens == 0
    with client.messages.stream(**options) as stream:
        streamed = stream.get_final_message().usage
    assert streamed.input_tokens + streamed.cache_read_input_tokens == prompt
    assert streamed.cache_read_input_tokens >= 64


def test_stream_text_equals_the_whole_message(client):
    options = dict(
        model=MODEL,
        max_tokens=20,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Count to five."}],
    )
    whole = client.messages.create(**options)
    with client.messages.stream(**options) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == whole.content[0].text == final.content[0].text
    assert (
        final.stop_reason == whole.stop_reason
        and final.usage.output_tokens == whole.usage.output_tokens
    )


def test_stop_sequences_report_the_sequence(client):
    message = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body={"temperature": 0},
        stop_sequences=["2"],
        messages=[{"role": "user", "content": "Count from 1 to 5, digits separated by spaces."}],
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "2"
    assert "2" not in message.content[0].text


def test_tool_use_round_trip(client):
    first = client.messages.create(
        model=MODEL,
        max_tokens=120,
        extra_body={"temperature": 0},
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=ASK,
    )
    assert first.stop_reason == "tool_use"
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])
    final = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body={"temperature": 0},
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            *ASK,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 28 C"}
                ],
            },
        ],
    )
    assert final.content[0].type == "text" and final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens")

    # A failed call's result tells the model so: its text reaches the prompt as an error.
    def counted(**flag) -> int:
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "timeout", **flag}
        conversation = [
            *ASK,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        return client.messages.count_tokens(
            model=MODEL, tools=[WEATHER], messages=conversation
        ).input_tokens

    assert counted(is_error=True) > counted()


def test_streamed_tool_use_matches(client):
    options = dict(
        model=MODEL,
        max_tokens=120,
        extra_body={"temperature": 0},
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=ASK,
    )
    whole = client.messages.create(**options)
    with client.messages.stream(**options) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [
        (b.type, b.name, b.input) for b in whole.content
    ]
    assert final.stop_reason == "tool_use"


class Place(pydantic.BaseModel):
    # Anthropic's schemas carry no string or number bounds (the client moves them into
    # descriptions): choices keep the small model's answer short.
    city: Literal["Paris", "Rome", "Lyon"]
    country: Literal["France", "Italy"]
    is_capital: bool


def test_output_config_format_makes_the_answer_json_of_its_schema(client):
    # Anthropic's structured outputs: the client's parse() sends the model's schema as
    # output_config.format; the answer parses, greedy and sampled, streamed or not.
    where = [{"role": "user", "content": "Where is the Eiffel tower? Answer in JSON."}]
    for temperature in (0, 1):
        parsed = client.messages.parse(
            model=MODEL,
            max_tokens=100,
            messages=where,
            output_format=Place,
            extra_body={"temperature": temperature},
        )
        assert parsed.stop_reason == "end_turn", parsed.content
        assert isinstance(parsed.parsed_output, Place)
    schema = {**WEATHER["input_schema"], "required": ["city", "unit"]}
    options = dict(
        model=MODEL,
        max_tokens=60,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    with client.messages.stream(**options) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    jsonschema.validate(json.loads(streamed), schema)
    assert final.stop_reason == "end_turn" and final.content[0].text == streamed
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        client.messages.create(
            **options, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}
        )


def test_fields_anthropic_honours_elsewhere_are_refused_by_name(client):
    # An effort level, a cache lifetime, fast mode and a region have nothing to act on here; a
    # field the server does not know is refused too, never ignored.
    refused = {
        "output_config": ({"effort": "high"}, "output_config.effort"),
        "cache_control": ({"type": "ephemeral", "ttl": "1h"}, "cache_control.ttl"),
        "speed": ("fast", "speed"),
        "inference_geo": ("us", "inference_geo"),
        "top_n": (3, "Unrecognized request argument supplied: top_n"),
    }
    for field, (value, named) in refused.items():
        with pytest.raises(anthropic.BadRequestError, match=named):
            client.messages.create(
                model=MODEL, max_tokens=1, messages=ASK, extra_body={field: value}
            )
    # Marking the prompt for caching is what the prefix cache does unasked.
    message = client.messages.create(
        model=MODEL, max_tokens=1, messages=ASK, cache_control={"type": "ephemeral"}
    )
    assert message.usage.output_tokens == 1


def test_bad_tool_choice_is_a_400(client):
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=MODEL,
            max_tokens=5,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "nope"},
            messages=ASK,
        )


@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["plain", "tools"])
def test_count_tokens_equals_the_input_tokens_a_message_reports(client, tools):
    options = dict(
        model=MODEL,
        system="Answer in one short sentence.",
        messages=ASK,
        **({"tools": tools} if tools else {}),
    )
    counted = client.messages.count_tokens(**options)
    message = client.messages.create(max_tokens=1, extra_body={"temperature": 0}, **options)
    usage = message.usage  # the prompt's tokens: computed afresh, and read from the cache
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens > 10


def test_count_tokens_refuses_what_a_message_would(client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="no-such-model", messages=ASK)
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.count_tokens(
            model=MODEL, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    with pytest.raises(anthropic.BadRequestError, match="messages"):
        client.messages.count_tokens(model=MODEL, messages=[])


def test_tools_that_anthropic_runs_are_refused_and_either_service_tier_passes(client):
    # MCP servers and code-execution containers run on Anthropic's side: a 200 here would
    # pretend. Both service tiers mean this server's one.
    refused = {
        "mcp_servers": [{"type": "url", "url": "https://mcp.example.com/sse", "name": "x"}],
        "container": "container_1",
        "context_management": {"edits": []},
    }
    for field, value in refused.items():
        with pytest.raises(anthropic.BadRequestError, match=field) as raised:
            client.messages.create(
                model=MODEL, max_tokens=1, messages=ASK, extra_body={field: value}
            )
        assert raised.value.status_code == 400
    for tier in ("auto", "standard_only"):
        message = client.messages.create(model=MODEL, max_tokens=1, messages=ASK, service_tier=tier)
        assert message.usage.output_tokens == 1
