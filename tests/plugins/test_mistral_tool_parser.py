"""The ``mistral`` tool-call parser: both of Mistral's layouts split from content, streamed, and its prompt ids."""

import json

import pytest

from spyglass.core.engine.tool_calls import ToolCallPiece
from spyglass.plugins.mistral_tool_parser import MistralToolCallParser, spyglass_tool_call_parser
from tests.plugins.conftest import parse_in_pieces

PARSES = [
    (  # Mistral 7B v0.3 / NeMo: a JSON array after the marker
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {}}]',
        None,
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    (  # Mistral Small 3.1+: name[ARGS]{...}, the marker before each call
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"z": "a}b"}',
        None,
        [("get_weather", {"city": "Paris"}), ("get_time", {"z": "a}b"})],
    ),
    (
        'Let me check.[TOOL_CALLS]f{"x": [1, {"y": 2}]} Done.',
        "Let me check. Done.",
        [("f", {"x": [1, {"y": 2}]})],
    ),
    (
        '[TOOL_CALLS][{"name": "a", "arguments": {"q": 1}}]\nThen text',
        "Then text",
        [("a", {"q": 1})],
    ),
    ("No calls, [just] text [TOOL_", "No calls, [just] text [TOOL_", []),
    # What is no call is shown, marker and all
    ("[TOOL_CALLS] hello world", "[TOOL_CALLS] hello world", []),
    ('[TOOL_CALLS]f[ARGS]"oops}', '[TOOL_CALLS]f[ARGS]"oops}', []),
    ('[TOOL_CALLS] [{"x": 1}] then', '[TOOL_CALLS] [{"x": 1}] then', []),
    ("[TOOL_CALLS]get_wea", "[TOOL_CALLS]get_wea", []),
]


@pytest.mark.parametrize("text, content, calls", PARSES)
def test_calls_and_content_come_apart_however_the_text_is_cut(text, content, calls):
    whole = MistralToolCallParser().parse(text)
    assert whole[0] == content
    assert [(call.name, json.loads(call.arguments)) for call in whole[1]] == calls
    for size in (1, 2, 3, 7):
        assert parse_in_pieces(MistralToolCallParser(), text, size) == whole


def test_a_call_is_named_before_its_arguments_end_and_a_cut_one_keeps_what_was_written():
    stream = MistralToolCallParser().stream()
    assert stream.feed("Sure. [TOOL_CA") == [ToolCallPiece("content", "Sure.")]
    assert stream.feed("LLS]get_weat") == []
    assert stream.feed('her[ARGS]{"ci') == [
        ToolCallPiece("call", "get_weather"),
        ToolCallPiece("arguments", '{"ci'),
    ]
    assert stream.feed('ty": "Ro') == [ToolCallPiece("arguments", 'ty": "Ro')]
    assert stream.finish() == []


def test_prompt_call_ids_are_nine_letters_and_digits_the_same_for_a_call_and_its_result():
    parser = MistralToolCallParser()
    assert parser.prompt_call_id("call_48b3157aefed47889241f75c") == "89241f75c"
    assert parser.prompt_call_id("toolu_01A-09q") == "olu01A09q"
    assert parser.prompt_call_id("ab-c") == "000000abc"
    assert parser.prompt_call_id("abc123XYZ") == "abc123XYZ"


def test_the_plugin_answers_only_its_name():
    assert isinstance(spyglass_tool_call_parser(name="mistral"), MistralToolCallParser)
    assert spyglass_tool_call_parser(name="hermes") is None
    assert MistralToolCallParser.reads_special_tokens
