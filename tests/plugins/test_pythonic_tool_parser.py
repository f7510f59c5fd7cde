"""The ``pythonic`` tool-call parser: a Python list of calls split from content, a call at a time."""

import json

import pytest

from spyglass.core.engine.tool_calls import ToolCallPiece
from spyglass.plugins.pythonic_tool_parser import PythonicToolCallParser, spyglass_tool_call_parser
from tests.plugins.conftest import parse_in_pieces

PARSES = [
    (
        "[get_weather(city=\"Paris\", unit='celsius'), get_time(city=\"Oslo\")]",
        None,
        [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"city": "Oslo"})],
    ),
    (  # literals of every kind; brackets and quotes inside strings do not count
        ' [f(s="Pa)ris", q=\'it\\\'s\', n=3, x=1.5, opts={"a": [1, (2)]}, ok=True, no=None)]\nDone.',
        "Done.",
        [("f", {"s": "Pa)ris", "q": "it's", "n": 3, "x": 1.5, "opts": {"a": [1, 2]}, "ok": True, "no": None})],
    ),
    ("[f()]", None, [("f", {})]),
    ("The answer is [1, 2]", "The answer is [1, 2]", []),
    ("[1, 2, 3]", "[1, 2, 3]", []),  # a list, but of no calls
    ('[get_weather("Paris")]', '[get_weather("Paris")]', []),  # not keywords
    ("[f(x=1), g(y={1, 2})]", ", g(y={1, 2})]", [("f", {"x": 1})]),  # a set is no JSON
    ('[get_weather(city="Par', '[get_weather(city="Par', []),  # cut short
    ("[f(x=1)] and more", "and more", [("f", {"x": 1})]),
]  # fmt: skip


@pytest.mark.parametrize("text, content, calls", PARSES)
def test_calls_and_content_come_apart_however_the_text_is_cut(text, content, calls):
    whole = PythonicToolCallParser().parse(text)
    assert whole[0] == content
    assert [(call.name, json.loads(call.arguments)) for call in whole[1]] == calls
    for size in (1, 2, 3, 7):
        assert parse_in_pieces(PythonicToolCallParser(), text, size) == whole


def test_each_call_comes_once_it_closes_and_content_streams_once_it_is_no_list():
    stream = PythonicToolCallParser().stream()
    assert stream.feed('[get_weather(city="Rome"') == []
    assert stream.feed("), get_ti") == [
        ToolCallPiece("call", "get_weather"),
        ToolCallPiece("arguments", '{"city": "Rome"}'),
    ]
    assert stream.finish() == [ToolCallPiece("content", ", get_ti")]
    stream = PythonicToolCallParser().stream()
    assert stream.feed("Sure, ") == [ToolCallPiece("content", "Sure,")]


def test_the_plugin_answers_only_its_name():
    assert isinstance(spyglass_tool_call_parser(name="pythonic"), PythonicToolCallParser)
    assert spyglass_tool_call_parser(name="hermes") is None
