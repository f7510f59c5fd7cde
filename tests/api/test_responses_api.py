"""OpenAI's Responses API through the official ``openai`` client: text, streams, structured output, function tools."""

import json

import httpx
import jsonschema
import openai
import pydantic
import pytest

MODEL = "SmolLM2-135M-Instruct"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "parameters": WEATHER_PARAMETERS,
}
ASK = [
    {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Rome?"}]}
]


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def test_text_answer_with_instructions_and_usage(real_client):
    response = real_client.responses.create(
        model=MODEL,
        instructions="Answer in one short sentence.",
        input="What is the capital of France?",
        temperature=0,
        max_output_tokens=24,
    )
    assert response.object == "response" and response.id.startswith("resp_")
    (message,) = response.output
    assert (
        message.type == "message"
        and message.role == "assistant"
        and message.content[0].type == "output_text"
    )
    assert "Paris" in response.output_text
    usage = response.usage
    assert usage.input_tokens > 10 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_max_output_tokens_makes_an_incomplete_response(real_client):
    response = real_client.responses.create(
        model=MODEL, input="Tell me a long story.", temperature=0, max_output_tokens=3
    )
    assert (
        response.status == "incomplete"
        and response.incomplete_details.reason == "max_output_tokens"
    )
    assert response.usage.output_tokens == 3 and response.output[0].status == "incomplete"


def test_message_items_make_the_same_prompt_as_a_string(real_client):
    as_string = real_client.responses.create(
        model=MODEL, input="Name a colour.", temperature=0, max_output_tokens=8
    )
    as_items = real_client.responses.create(
        model=MODEL,
        temperature=0,
        max_output_tokens=8,
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Name a colour."}],
            }
        ],
    )
    assert as_items.output_text == as_string.output_text
    assert as_items.usage.input_tokens == as_string.usage.input_tokens


def test_stream_events_in_order_and_text_equals_the_whole_answer(real_client):
    options = dict(model=MODEL, input="Count to five.", temperature=0, max_output_tokens=20)
    whole = real_client.responses.create(**options)
    events = list(real_client.responses.create(stream=True, **options))
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 3
    terminal = "response.incomplete" if whole.status == "incomplete" else "response.completed"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        terminal,
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    streamed = "".join(
        event.delta for event in events if event.type == "response.output_text.delta"
    )
    assert streamed == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_stream_helper_assembles_the_final_response(real_client):
    options = dict(model=MODEL, input="Say hello.", temperature=0, max_output_tokens=60)
    whole = real_client.responses.create(**options)
    with real_client.responses.stream(**options) as stream:
        text = "".join(
            event.delta for event in stream if event.type == "response.output_text.delta"
        )
        final = stream.get_final_response()
    assert text == final.output_text == whole.output_text


def test_logprobs_are_the_ones_chat_gives_the_same_answer(real_client):
    options = dict(model=MODEL, temperature=0, max_output_tokens=12)
    included = ["message.output_text.logprobs"]
    answer = real_client.responses.create(
        input="Name a colour.", include=included, top_logprobs=2, **options
    )
    chat = real_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        temperature=0,
        max_tokens=12,
        logprobs=True,
        top_logprobs=2,
    )
    (part,) = answer.output[0].content
    assert answer.top_logprobs == 2 and part.text == chat.choices[0].message.content
    expected = chat.choices[0].logprobs.content
    assert len(part.logprobs) == len(expected) == answer.usage.output_tokens
    for got, want in zip(part.logprobs, expected):
        assert (got.token, got.bytes) == (want.token, want.bytes)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert [top.token for top in got.top_logprobs] == [top.token for top in want.top_logprobs]
    # Streamed: each delta carries its tokens' logprobs, and together they are the whole's.
    events = list(
        real_client.responses.create(
            input="Name a colour.", include=included, top_logprobs=2, stream=True, **options
        )
    )
    streamed = [
        entry.token
        for event in events
        if event.type == "response.output_text.delta"
        for entry in event.logprobs
    ]
    assert streamed == [entry.token for entry in part.logprobs]
    done = next(event for event in events if event.type == "response.output_text.done")
    assert [entry.token for entry in done.logprobs] == streamed
    # Asked for by include alone: no alternatives; not asked for: none.
    bare = real_client.responses.create(input="Name a colour.", include=included, **options)
    assert bare.output[0].content[0].logprobs[0].top_logprobs == []
    plain = real_client.responses.create(input="Name a colour.", **options)
    assert plain.output[0].content[0].logprobs == []


def test_parse_with_a_pydantic_model(real_client):
    response = real_client.responses.parse(
        model=MODEL,
        input="Describe Paris as JSON with its name, country and population.",
        text_format=City,
        temperature=0,
        max_output_tokens=100,
    )
    assert isinstance(response.output_parsed, City)


def test_json_schema_and_json_object_formats(real_client):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response = real_client.responses.create(
        model=MODEL,
        input="What is 2 + 2? Reply in JSON.",
        temperature=0,
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "sum", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"
    response = real_client.responses.create(
        model=MODEL,
        input="Give a JSON object about a cat.",
        temperature=0,
        max_output_tokens=60,
        text={"format": {"type": "json_object"}},
    )
    assert response.status == "incomplete" or isinstance(json.loads(response.output_text), dict)


def test_function_call_round_trip(real_client):
    first = real_client.responses.create(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=120,
    )
    (call,) = first.output
    assert (
        call.type == "function_call"
        and call.name == "get_weather"
        and call.call_id.startswith("call_")
    )
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    final = real_client.responses.create(
        model=MODEL,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_output_tokens=40,
        input=[
            *ASK,
            call.model_dump(exclude_none=True),
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": '{"forecast": "sunny, 28 C"}',
            },
        ],
    )
    assert final.output[0].type == "message" and final.output_text


def test_streamed_function_call_matches_the_whole_one(real_client):
    options = dict(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=120,
    )
    whole = real_client.responses.create(**options).output[0]
    events = list(real_client.responses.create(stream=True, **options))
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert len(deltas) > 3 and "".join(deltas) == done.arguments == whole.arguments
    assert (
        events[-1].type == "response.completed"
        and events[-1].response.output[0].arguments == whole.arguments
    )


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),  # not kept
        ({"background": True, "store": False}, "background"),  # nothing to read it back from
        ({"reasoning": {"effort": "low"}}, "reasoning"),  # the tiny model's template ignores it
        ({"reasoning": {"summary": "auto"}}, "reasoning"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"include": ["message.input_image.image_url"]}, "include"),
        ({"truncation": "middle"}, "truncation"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "x"}],
                    }
                ]
            },
            "input",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
        ({"input": []}, "input"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "text": {"format": {"type": "json_object"}},
            },
            "tool_choice",
        ),
    ],
)
def test_unsupported_or_invalid_fields_are_400s_naming_the_field(tiny_server, extra, param):
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, **extra}
    response = httpx.post(f"{tiny_server.base_url}/v1/responses", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_the_client_sees_a_400_as_a_bad_request(tiny_client):
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        tiny_client.responses.create(
            model="tiny", input="hi", previous_response_id="resp_1", max_output_tokens=2
        )
