"""The ``llama3_json`` tool-call parser: Llama 3.1's JSON calls split from content, streamed, and held by a grammar."""

import json

import pytest

from spyglass.core.engine.tool_calls import ParsedToolCall, ToolCallPiece
from spyglass.plugins.llama3_json_tool_parser import (
    Llama3JsonToolCallParser,
    spyglass_tool_call_parser,
)
from tests.plugins.conftest import parse_in_pieces

PARSES = [
    (
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        None,
        [("get_weather", {"city": "Paris", "unit": "celsius"})],
    ),
    (  # the tag Llama writes before calls (seen when special tokens are kept); ';' between calls
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
        None,
        [("a", {"x": 1}), ("b", {})],
    ),
    ("  The weather is {sunny}.", "The weather is {sunny}.", []),
    ('{"answer": 42} is my answer', '{"answer": 42} is my answer', []),  # JSON, not a call
    ('{"parameters": {"q": "a}b"}, "name": "z"}\n\nDone.', "Done.", [("z", {"q": "a}b"})]),
    ('{"type": "function", "name": "f", "arguments": {"s": "\\" {"}}', None, [("f", {"s": '" {'})]),
    (
        '<|python_tag|>brave_search.call(query="x")',
        '<|python_tag|>brave_search.call(query="x")',
        [],
    ),
    ("<|pyth", "<|pyth", []),
    ("   ", None, []),
]


@pytest.mark.parametrize("text, content, calls", PARSES)
def test_calls_and_content_come_apart_however_the_text_is_cut(text, content, calls):
    whole = Llama3JsonToolCallParser().parse(text)
    assert whole[0] == content
    assert [(call.name, json.loads(call.arguments)) for call in whole[1]] == calls
    for size in (1, 2, 3, 7):
        assert parse_in_pieces(Llama3JsonToolCallParser(), text, size) == whole


def test_a_call_is_named_before_its_arguments_end_and_a_cut_one_keeps_what_was_written():
    stream = Llama3JsonToolCallParser().stream()
    assert stream.feed('<|python_tag|>{"name": "get_w') == []
    assert stream.feed('eather", "parameters": {"ci') == [
        ToolCallPiece("call", "get_weather"),
        ToolCallPiece("arguments", '{"ci'),
    ]
    assert stream.feed('ty": "Ro') == [ToolCallPiece("arguments", 'ty": "Ro')]
    assert stream.finish() == []
    assert Llama3JsonToolCallParser().parse('{"name": "cut", "parameters": {"x": [1') == (
        None,
        [ParsedToolCall("cut", '{"x": [1')],
    )


def test_content_streams_as_soon_as_it_is_no_call():
    stream = Llama3JsonToolCallParser().stream()
    assert stream.feed(" <|py") == []
    assert stream.feed("thon") == []
    assert stream.feed("!") == [ToolCallPiece("content", "<|python!")]
    assert stream.feed(" More") == [ToolCallPiece("content", " More")]


def test_the_plugin_answers_only_its_name():
    assert isinstance(spyglass_tool_call_parser(name="llama3_json"), Llama3JsonToolCallParser)
    assert spyglass_tool_call_parser(name="hermes") is None


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}


def _call(name: str, parameters: dict) -> str:
    return json.dumps({"name": name, "parameters": parameters})


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one call"])
def test_the_strict_grammar_holds_calls_and_leaves_text_free(grammar_accepts, parallel):
    # OpenAI's strict functions with tool_choice auto: an answer is text, or calls of offered
    # functions whose parameters obey their schemas (a function that is not strict takes any
    # object); nothing follows the calls.
    grammar = Llama3JsonToolCallParser().strict_grammar(
        {"get_weather": WEATHER, "get_time": {"type": "object"}}, parallel
    )

    def allowed(text: str) -> bool:
        return grammar_accepts(grammar, text)

    weather, time = _call("get_weather", {"city": "Rome"}), _call("get_time", {"zone": 1})
    assert allowed("No call needed: it is sunny {today}.")
    assert allowed(f"\n{weather}")
    assert allowed(f"{weather}; {time}") == parallel  # a second call
    assert not allowed(_call("get_weather", {"town": "Rome"}))  # not its schema
    assert not allowed(_call("get_weather", {"city": "Rome", "days": "two"}))
    assert not allowed(_call("get_news", {}))  # no such function
    assert not allowed('{"answer": 42}')  # an object that is no call
    assert not allowed(f"{weather} and some text")
