"""The ``phi4_mini_json`` tool-call parser: Phi-4-mini's ``functools[...]`` calls split from content, streamed."""

import json

import pytest

from spyglass.core.engine.tool_calls import ToolCallPiece
from spyglass.plugins.phi4_mini_tool_parser import Phi4MiniToolCallParser, spyglass_tool_call_parser
from tests.plugins.conftest import parse_in_pieces

PARSES = [
    (
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "parameters": {"tz": "a]b"}}]',
        None,
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "a]b"})],
    ),
    ('Let me check. functools[{"name": "f", "arguments": {}}]\nDone.', "Let me check. \nDone.", [("f", {})]),
    ("No calls, just functools text", "No calls, just functools text", []),
    # What is no call is shown, marker and all
    ('functools[{"x": 1}] then', 'functools[{"x": 1}] then', []),
    ("functools[1, 2]", "functools[1, 2]", []),
    ('functools[{"name": "f", "arguments": {}}, 7]', "7]", [("f", {})]),
    ('functools[{"name": "cut", "arguments": {"a": [1', None, [("cut", None)]),  # cut short
    ("text functool", "text functool", []),
]  # fmt: skip


@pytest.mark.parametrize("text, content, calls", PARSES)
def test_calls_and_content_come_apart_however_the_text_is_cut(text, content, calls):
    whole = Phi4MiniToolCallParser().parse(text)
    assert whole[0] == content
    assert [c.name for c in whole[1]] == [name for name, _ in calls]
    for call, (_, arguments) in zip(whole[1], calls, strict=True):
        if arguments is not None:
            assert json.loads(call.arguments) == arguments
    for size in (1, 2, 3, 7):
        assert parse_in_pieces(Phi4MiniToolCallParser(), text, size) == whole


def test_a_call_is_named_before_its_arguments_end():
    stream = Phi4MiniToolCallParser().stream()
    assert stream.feed("Sure. functo") == [ToolCallPiece("content", "Sure.")]
    assert stream.feed('ols[{"name": "get_weather", "arguments": {"ci') == [
        ToolCallPiece("call", "get_weather"),
        ToolCallPiece("arguments", '{"ci'),
    ]
    assert stream.feed('ty": "Rome"}}]') == [ToolCallPiece("arguments", 'ty": "Rome"}')]
    assert stream.finish() == []


def test_the_plugin_answers_only_its_name():
    assert isinstance(spyglass_tool_call_parser(name="phi4_mini_json"), Phi4MiniToolCallParser)
    assert spyglass_tool_call_parser(name="hermes") is None
