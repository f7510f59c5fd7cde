"""The ``qwen3_coder`` tool-call parser: XML-like calls split from content, typed by the offered schemas, streamed."""

import json

import pytest

from spyglass.core.engine.tool_calls import ToolCallPiece
from spyglass.plugins.qwen3_coder_tool_parser import (
    Qwen3CoderToolCallParser,
    spyglass_tool_call_parser,
)
from tests.plugins.conftest import parse_in_pieces

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "zip": {"type": "string"},
                    "days": {"type": "integer"},
                    "scale": {"type": "number"},
                    "metric": {"type": "boolean"},
                    "options": {"type": "object"},
                    "hours": {"type": "array"},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    }
]


def _block(name: str, **parameters: str) -> str:
    written = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters.items())
    return f"<tool_call>\n<function={name}>\n{written}</function>\n</tool_call>"


PARSES = [
    (
        "Let me check.\n"
        + _block(
            "get_weather",
            city="Paris",
            zip="75001",
            days="3",
            scale="1.5",
            metric="True",
            options='{"a": [1]}',
            hours="[9, 12]",
        ),
        "Let me check.",
        [
            (
                "get_weather",
                {
                    "city": "Paris",
                    "zip": "75001",  # a string parameter keeps its digits as text
                    "days": 3,
                    "scale": 1.5,
                    "metric": True,
                    "options": {"a": [1]},
                    "hours": [9, 12],
                },
            )
        ],
    ),
    (  # a value that does not convert stays text; a multi-line one keeps its lines
        _block("get_weather", days="three", city="New\nYork") + " Done.",
        "Done.",
        [("get_weather", {"days": "three", "city": "New\nYork"})],
    ),
    (  # several blocks, one without parameters; an unknown function's values are text
        _block("get_weather") + "\n" + _block("other", x="1"),
        None,
        [("get_weather", {}), ("other", {"x": "1"})],
    ),
    ("<function=get_weather>\n</function>", None, [("get_weather", {})]),  # no <tool_call>
    (  # stray text between parameters belongs to no value
        "<function=get_weather>\nhm\n<parameter=days>\n2\n</parameter>\nok\n</function> x",
        "x",
        [("get_weather", {"days": 2})],
    ),
    ("Text <tool_call> not a call", "Text <tool_call> not a call", []),
    ("Text <tool_ca", "Text <tool_ca", []),
    ("<function=bad\nname>", "<function=bad\nname>", []),
]


@pytest.mark.parametrize("text, content, calls", PARSES)
def test_calls_and_content_come_apart_however_the_text_is_cut(text, content, calls):
    parser = Qwen3CoderToolCallParser().with_tools(TOOLS)
    whole = parser.parse(text)
    assert whole[0] == content
    assert [(call.name, json.loads(call.arguments)) for call in whole[1]] == calls
    for size in (1, 2, 3, 7):
        assert parse_in_pieces(parser, text, size) == whole


def test_arguments_stream_a_parameter_at_a_time_and_a_cut_call_keeps_those_that_closed():
    stream = Qwen3CoderToolCallParser().with_tools(TOOLS).stream()
    assert stream.feed("Sure.\n<tool_call>\n<function=get_wea") == [
        ToolCallPiece("content", "Sure.")
    ]
    assert stream.feed("ther>\n<parameter=days>\n2") == [ToolCallPiece("call", "get_weather")]
    assert stream.feed("\n</parameter>\n<parameter=city>\nRo") == [
        ToolCallPiece("arguments", '{"days": 2')
    ]
    assert stream.finish() == []  # the city never closed


def test_without_the_tools_values_are_text():
    [call] = Qwen3CoderToolCallParser().parse(_block("get_weather", days="3"))[1]
    assert json.loads(call.arguments) == {"days": "3"}


def test_the_plugin_answers_only_its_name():
    assert isinstance(spyglass_tool_call_parser(name="qwen3_coder"), Qwen3CoderToolCallParser)
    assert spyglass_tool_call_parser(name="hermes") is None
