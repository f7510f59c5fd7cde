"""Structural tags: any text, but a trigger opens a structure whose JSON must obey its schema.

Walked token by token through the grammar's masks on the tiny model's vocabulary."""

import pytest

from spyglass.core.engine.sampling_params import StructuredOutput
from spyglass.plugins.structured_output import grammar_text
from spyglass.plugins.think_reasoning import FORMATS

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
SPEC = {
    "structures": [
        {"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
        {"begin": "<function=get_time>", "schema": TIME, "end": "</function>"},
        {"begin": "[[calc|", "schema": {"type": "object"}, "end": "]]"},
    ],
    "triggers": ["<function=", "[[calc|"],
}


TAGS = StructuredOutput("structural_tag", SPEC)


@pytest.fixture(scope="module")
def allows(grammar_accepts):
    def check(text: str, spec: StructuredOutput = TAGS) -> bool:
        return grammar_accepts(grammar_text(spec), text)

    return check


@pytest.mark.parametrize(
    "text",
    [
        "Just words, no calls at all.",
        'Let me check. <function=get_weather>{"city": "Oslo"}</function> Done.',
        '<function=get_time>{"zone": "CET"}</function><function=get_weather>{"city": "Rome"}</function>',
        'Sum: [[calc|{"a": 1, "b": [2, 3]}]] and more text < function = not a trigger',
    ],
)
def test_text_and_structures_that_obey_their_schemas_pass(allows, text):
    assert allows(text)


@pytest.mark.parametrize(
    "text",
    [
        '<function=get_weather>{"city": 5}</function>',  # the schema's type
        '<function=get_weather>{"town": "Oslo"}</function>',  # a key the schema forbids
        '<function=get_time>{"zone": "PST"}</function>',  # outside the enum
        '<function=get_news>{"topic": "x"}</function>',  # no structure begins so
        'text <function=get_weather>{"city": "Oslo"}</tool>',  # the wrong end
        "[[calc|not json]]",
    ],
)
def test_a_trigger_holds_the_text_to_a_structure(allows, text):
    assert not allows(text)


def test_tags_hold_from_the_first_token_never_after_a_thought():
    # The answer is free text, so a thought is one too (its reasoning is split off as usual);
    # an optional opening tag could not be told from answer text that starts the same way.
    with pytest.raises(ValueError, match="cannot follow reasoning"):
        StructuredOutput("structural_tag", SPEC, after_reasoning=FORMATS["qwen3"].reasoning_rules())


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"structures": [], "triggers": ["<f"]}, "non-empty list of structures"),
        ({**SPEC, "triggers": []}, "non-empty list of triggers"),
        ({**SPEC, "triggers": ["<function=", "[[calc|", "<tool>"]}, "trigger '<tool>' begins none"),
        ({**SPEC, "triggers": ["<function="]}, "begins with none of the triggers"),
        ({**SPEC, "structures": [{"begin": "<function=x>", "end": "</function>"}]}, "schema"),
        ("not an object", "an object with structures and triggers"),
    ],
)
def test_a_malformed_spec_says_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        grammar_text(StructuredOutput("structural_tag", spec))
