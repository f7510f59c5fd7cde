"""The ``<think>`` reasoning formats: whole outputs split as DeepSeek-R1 and Qwen3 write them, and a
stream fed in any pieces assembles to the same split."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spyglass.core.engine.reasoning import split_reasoning
from spyglass.core.engine.sampling_params import StructuredOutput
from spyglass.plugins.structured_output import grammar_text
from spyglass.plugins.think_reasoning import FORMATS, spyglass_reasoning_parser

CASES = [
    # (format, output, reasoning, content)
    ("deepseek_r1", "Let me think.\n</think>\n\nThe answer is 4.", "Let me think.\n", "The answer is 4."),
    ("deepseek_r1", "<think>\nHmm.</think>Four.", "Hmm.", "Four."),
    ("deepseek_r1", "Cut off while still thinking", "Cut off while still thinking", None),
    ("deepseek_r1", "</think>Only an answer.", None, "Only an answer."),
    ("qwen3", "<think>\nstep 1, step 2\n</think>\n\nDone.", "step 1, step 2\n", "Done."),
    ("deepseek_r1", "\n  Okay.</think>Yes.", "Okay.", "Yes."),
    ("qwen3", "  <think>a</think>b", "a", "b"),
    ("qwen3", "No thinking here, 2 < 3.", None, "No thinking here, 2 < 3."),
    ("qwen3", "<think>cut off", "cut off", None),
    ("qwen3", "<thin", None, "<thin"),  # a partial tag at the very end is text after all
    ("qwen3", "", None, None),
    ("mistral", "[THINK]Paris is in France.[/THINK]\n\nParis.", "Paris is in France.", "Paris."),
    ("mistral", "No thinking [THINK] here", None, "No thinking [THINK] here"),
    ("mistral", "<think>not Magistral's tags</think>", None, "<think>not Magistral's tags</think>"),
    ("mistral", "  [THINK]cut off", "cut off", None),
    ("mistral", "[THI", None, "[THI"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_whole_outputs_split_into_reasoning_and_content(name, text, reasoning, content):
    assert split_reasoning(FORMATS[name], text) == (reasoning, content)


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
@given(cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8))
def test_a_stream_in_any_pieces_assembles_to_the_whole_split(name, text, reasoning, content, cuts):
    stream = FORMATS[name].stream()
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = []
    for start, end in itertools.pairwise(bounds):
        pieces += stream.feed(text[start:end])
    pieces += stream.finish()
    got_reasoning = "".join(p.text for p in pieces if p.kind == "reasoning") or None
    got_content = "".join(p.text for p in pieces if p.kind == "content") or None
    assert (got_reasoning, got_content) == (reasoning, content)
    kinds = [p.kind for p in pieces]
    assert kinds == sorted(kinds, key=lambda k: k == "content")  # reasoning never after content


def test_reasoning_streams_as_it_is_written():
    stream = FORMATS["deepseek_r1"].stream()
    assert [p.text for p in stream.feed("First, ")] == ["First, "]
    assert [p.text for p in stream.feed("then</th")] == ["then"]  # the tag's start is held
    assert [(p.kind, p.text) for p in stream.feed("ink> ok")] == [("content", "ok")]


def test_the_hook_names_the_formats():
    assert spyglass_reasoning_parser(name="qwen3") is FORMATS["qwen3"]
    assert spyglass_reasoning_parser(name="mistral").reads_special_tokens  # [THINK] is special
    assert not FORMATS["qwen3"].reads_special_tokens
    assert spyglass_reasoning_parser(name="hermes") is None


ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["Paris", "Lyon"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_a_constraint_holds_from_the_end_of_the_reasoning_on(grammar_accepts, name):
    # As vLLM applies structured outputs to a reasoning model: the thought is free (anything
    # but its closing tag), the answer after it obeys the schema.
    think = FORMATS[name]
    spec = StructuredOutput("json_schema", ANSWER, after_reasoning=think.reasoning_rules())
    grammar = grammar_text(spec)
    opening = "" if think.starts_in_reasoning else "<think>"
    thought = (
        f'{opening}Lyon? No: {{"answer": "Paris"}}, if a < b, </div> or </thin, then.</think>\n\n'
    )
    assert grammar_accepts(grammar, thought + '{"answer": "Paris"}')
    assert not grammar_accepts(grammar, thought + "Paris")
    assert not grammar_accepts(grammar, thought + '{"answer": "Nice"}')
    # qwen3 reasons only when the answer opens <think>: otherwise the schema holds at once;
    # deepseek_r1's answer starts in its thought, where anything goes.
    assert grammar_accepts(grammar, '{"answer": "Nice"}') == (name == "deepseek_r1")


def test_a_budget_closes_the_thought_and_magistral_tags_give_no_rules(grammar_accepts):
    rules = FORMATS["deepseek_r1"].reasoning_rules(budget=4)
    grammar = grammar_text(StructuredOutput("regex", "(?s:.*)", after_reasoning=rules))
    # The tag's tokens, as the model writes it, count in the thought: " a", "</", "think".
    assert grammar_accepts(grammar, " a</think> then anything")
    assert grammar_accepts(grammar, " a b c d</think> then anything")  # the tag forced at 4
    assert not grammar_accepts(grammar, " a b c d e</think>")
    assert FORMATS["mistral"].reasoning_rules() is None  # [THINK] is a special token
