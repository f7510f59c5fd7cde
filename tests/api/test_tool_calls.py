"""Tool calling through the official OpenAI client: forced calls always validate, streams match, round trips work."""

import json

import jsonschema
import openai
import pytest

from spyglass.core.api.chat import render_messages
from spyglass.core.api.reasoning_output import split_choice
from spyglass.core.api.schemas import ChatMessage, FunctionCall, ToolCall
from spyglass.core.api.tools import OutputSplitter, ToolFormat, ToolUse
from spyglass.core.engine.call_streams import JsonCallsStream
from spyglass.core.engine.tool_calls import ParsedToolCall, ToolCallPiece, collect
from spyglass.plugins.hermes_tool_parser import HermesToolCallParser
from tests.plugins.conftest import parse_in_pieces

MODEL = "SmolLM2-135M-Instruct"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]
ASK = [{"role": "user", "content": "What will the weather be in Paris tomorrow?"}]
HERMES = ToolFormat("hermes", HermesToolCallParser())


def test_required_calls_parse_and_validate_twenty_times_of_twenty(real_client):
    response = real_client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.8,
        seed=5,
        n=20,
        max_tokens=200,
    )
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        schema = next(
            t["function"]["parameters"]
            for t in TOOLS
            if t["function"]["name"] == call.function.name
        )
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_streamed_tool_call_deltas_concatenate_to_the_whole_call(real_client):
    options = dict(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        temperature=0,
        max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    whole = real_client.chat.completions.create(**options).choices[0]
    names, arguments, finish = {}, {}, None
    for chunk in real_client.chat.completions.create(stream=True, **options):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.function.name:
                    names[delta.index] = delta.function.name
                arguments[delta.index] = arguments.get(delta.index, "") + (
                    delta.function.arguments or ""
                )
            finish = choice.finish_reason or finish
    assert finish == whole.finish_reason == "tool_calls"
    assert [names[0], arguments[0]] == [
        whole.message.tool_calls[0].function.name,
        whole.message.tool_calls[0].function.arguments,
    ]
    jsonschema.validate(json.loads(arguments[0]), WEATHER_PARAMETERS)


def test_tool_calls_stream_token_by_token_and_the_client_helper_assembles_them(real_client):
    options = dict(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        temperature=0,
        max_tokens=200,
        tool_choice="required",
        parallel_tool_calls=False,
    )
    whole = real_client.chat.completions.create(**options).choices[0].message
    deltas = []
    with real_client.chat.completions.stream(**options) as stream:
        for event in stream:
            if event.type == "chunk":
                deltas += [d for c in event.chunk.choices for d in c.delta.tool_calls or []]
        final = stream.get_final_completion().choices[0]
    # The first delta of a call names it (with its id); the arguments follow in many small fragments.
    assert (
        deltas[0].id.startswith("call_")
        and deltas[0].function.name == whole.tool_calls[0].function.name
    )
    assert sum(1 for d in deltas if d.function.arguments) > 3
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]


def test_round_trip_call_result_answer(real_client):
    first = (
        real_client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=200,
        )
        .choices[0]
        .message
    )
    history = [
        *ASK,
        first.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": first.tool_calls[0].id,
            "content": '{"forecast": "sunny, 24 C"}',
        },
    ]
    final = real_client.chat.completions.create(
        model=MODEL,
        messages=history,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=60,
    ).choices[0]
    assert (
        final.finish_reason in ("stop", "length")
        and final.message.content
        and not final.message.tool_calls
    )


def test_fallback_prompt_lists_tools_and_writes_calls_and_results(default_checkpoint):
    tokenizer = default_checkpoint.tokenizer
    assert not tokenizer.template_takes_tools
    messages = [
        ChatMessage("user", "Weather in Oslo?"),
        ChatMessage(
            "assistant",
            None,
            tool_calls=[
                ToolCall(id="call_1", function=FunctionCall("get_weather", '{"city": "Oslo"}'))
            ],
        ),
        ChatMessage("tool", "rain", tool_call_id="call_1"),
    ]
    _, prompt, _ = render_messages(messages, tokenizer, ToolUse(TOOLS, "auto"))
    assert "<tools>" in prompt and '"get_weather"' in prompt
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        in prompt
    )
    assert "<|im_start|>user\n<tool_response>\nrain\n</tool_response>" in prompt


def test_hermes_parser_keeps_what_it_cannot_parse():
    text = (
        'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        "<tool_call>not json</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}'
    )
    content, calls = HermesToolCallParser().parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]
    assert content == "Let me check.\n\n<tool_call>not json</tool_call>"
    assert HermesToolCallParser().parse("no calls here") == ("no calls here", [])


HERMES_OUTPUTS = [
    ' Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n',
    '<tool_call>{"arguments": {"q": "a}b"}, "name": "z"}</tool_call> then text <tool_ca',
    '<tool_call>{"name": "w", "arguments": {"s": "</tool_call> \\" {", "n": [1, {"a": 2}]}}</tool_call>'
    '<tool_call>{"name": "v", "arguments": {"cut": 1',
]


@pytest.mark.parametrize("text", HERMES_OUTPUTS)
def test_hermes_stream_assembles_to_the_whole_parse_however_the_text_is_cut(text):
    whole = HermesToolCallParser().parse(text)
    for size in (1, 2, 3, 7):
        assert parse_in_pieces(HermesToolCallParser(), text, size) == whole


def test_hermes_stream_names_the_call_before_its_arguments_end():
    stream = HermesToolCallParser().stream()
    assert stream.feed('Ok <tool_call>\n{"name": "get_w') == [ToolCallPiece("content", "Ok")]
    assert stream.feed('eather", "arguments": {"ci') == [
        ToolCallPiece("call", "get_weather"),
        ToolCallPiece("arguments", '{"ci'),
    ]
    assert stream.feed('ty": "Rome"}}\n</tool_call>') == [
        ToolCallPiece("arguments", 'ty": "Rome"}')
    ]
    assert stream.finish() == []


def test_without_parallel_calls_an_answer_holds_its_first_call_only():
    # OpenAI's parallel_tool_calls: false (Anthropic's disable_parallel_tool_use) promises at
    # most one call; with auto and no strict grammar the model may write more.
    text = (
        'Both.\n<tool_call>{"name": "get_time", "arguments": {"city": "Oslo"}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call> Done.'
    )
    one = ToolUse(TOOLS, "auto", parallel=False)
    _, content, calls = split_choice(text, None, one, HERMES)
    assert content == "Both.\n\n Done."
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_time", '{"city": "Oslo"}')
    ]
    splitter = OutputSplitter(one, HERMES)
    pieces = [p for i in range(0, len(text), 5) for p in splitter.feed(text[i : i + 5], False)]
    assert collect(pieces + splitter.feed("", True)) == (
        "Both.\n\n Done.",
        [ParsedToolCall("get_time", '{"city": "Oslo"}')],
    )
    assert len(split_choice(text, None, ToolUse(TOOLS, "auto"), HERMES)[2]) == 2


def test_constrained_calls_stream_like_hermes_blocks():
    text = (
        '[{"name": "get_time", "arguments": {"city": "Oslo"}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    )
    stream = JsonCallsStream(parallel=True)
    pieces = [
        p for i in range(0, len(text), 4) for p in stream.feed(text[i : i + 4])
    ] + stream.finish()
    assert collect(pieces) == (
        None,
        [
            ParsedToolCall("get_time", '{"city": "Oslo"}'),
            ParsedToolCall("get_weather", '{"city": "Rome"}'),
        ],
    )


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
    ],
)
def test_bad_tool_requests_are_400s(tiny_client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        tiny_client.chat.completions.create(model="tiny", messages=ASK, max_tokens=3, **extra)
    assert param in str(error.value.body)


def test_completions_refuse_tools(tiny_client):
    with pytest.raises(openai.BadRequestError, match="tools"):
        tiny_client.completions.create(
            model="tiny", prompt="x", max_tokens=3, extra_body={"tools": TOOLS}
        )


def test_strict_functions_hold_their_calls_with_tool_choice_auto(real_client):
    # OpenAI's strict: true with tool_choice auto. The model chooses whether to call (this small
    # one seldom does, and unconstrained it opens blocks such as <tool_call>{"name": "Paris in
    # celsius.json", ...}); every block it opens under strict is a call that obeys its schema.
    strict = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
    response = real_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Use the get_weather tool for Paris in celsius."}],
        tools=strict,
        temperature=0.8,
        seed=3,
        n=40,
        max_tokens=200,
    )
    calls = 0
    for choice in response.choices:
        if choice.finish_reason == "length":
            continue  # a call cut short keeps what was written
        assert "<tool_call>" not in (choice.message.content or ""), choice.message.content
        for call in choice.message.tool_calls or []:
            schema = next(
                t["function"]["parameters"]
                for t in TOOLS
                if t["function"]["name"] == call.function.name
            )
            jsonschema.validate(json.loads(call.function.arguments), schema)
            calls += 1
    assert calls >= 1
    # Strict functions constrain the output: no second constraint beside them.
    with pytest.raises(openai.BadRequestError, match="strict functions"):
        real_client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=strict,
            response_format={"type": "json_object"},
            max_tokens=5,
        )
