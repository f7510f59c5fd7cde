"""vLLM's ``structural_tag`` response format through the OpenAI client: any text, but each trigger
the model writes opens a structure whose JSON obeys its schema."""

import json
import re

import openai
import pytest

from spyglass.core.api.errors import APIError
from spyglass.core.api.reasoning_output import (
    held_after_reasoning,
    reasoning_for,
    thinking_constraint,
)
from spyglass.core.api.tools import ToolUse
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from spyglass.plugins.think_reasoning import FORMATS
from tests.telemetry.test_answer_tracing import UNIT as CHAT_UNIT

UNIT = CHAT_UNIT["function"]["parameters"]  # a unit: JSON that ends, whatever the model writes
UNITS = tuple(UNIT["properties"]["unit"]["enum"])
TAGS = {
    "type": "structural_tag",
    "structures": [{"begin": "<u>", "schema": UNIT, "end": "</u>"}],
    "triggers": ["<"],
}
LESS_THAN = "44"  # "<" in the tiny model's vocabulary
STRUCTURE = re.compile(r'<u>\{"unit": ?"(celsius|fahrenheit)"\}</u>')


@pytest.fixture(scope="module")
def client(tiny_compact_server):
    return openai.OpenAI(base_url=f"{tiny_compact_server.base_url}/v1", api_key="unused")


def _ask(client, **extra) -> str:
    """A chat answer pushed to write ``<`` wherever it may: each one opens a structure."""
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Which unit?"}],
        max_tokens=48,
        temperature=0,
        logit_bias={LESS_THAN: 100},
        **extra,
    )
    return reply.choices[0].message.content


def test_every_trigger_opens_a_structure_that_obeys_its_schema(client):
    text = _ask(client, response_format=TAGS)
    structures = STRUCTURE.findall(text)
    assert text.startswith("<u>") and len(structures) >= 2, text
    # Between the structures, text without a trigger; at the end, maybe one the length cut.
    free, trigger, cut = STRUCTURE.sub("", text).partition("<")
    assert "<" not in free and "<" not in cut, text
    if trigger:
        assert any(f'<u>{{"unit": "{unit}"}}</u>'.startswith(trigger + cut) for unit in UNITS)
    unconstrained = _ask(client)
    assert not STRUCTURE.match(unconstrained)  # the bias alone writes no structure


def test_vllm_structured_outputs_field_takes_the_spec_as_json_text(client):
    spec = {k: v for k, v in TAGS.items() if k != "type"}
    text = _ask(client, extra_body={"structured_outputs": {"structural_tag": json.dumps(spec)}})
    assert text == _ask(client, response_format=TAGS)


@pytest.mark.parametrize(
    "tags, says",
    [
        ({**TAGS, "triggers": ["<", "["]}, "trigger '[' begins none of the structures"),
        ({**TAGS, "triggers": ["{"]}, "begins with none of the triggers"),
        ({**TAGS, "structures": [{"begin": "<u>", "end": "</u>"}]}, "schema"),
        ({"type": "structural_tag", "format": {"type": "any_text"}}, "format"),
    ],
)
def test_a_malformed_structural_tag_is_a_400_naming_it(client, tags, says):
    with pytest.raises(openai.BadRequestError) as error:
        _ask(client, response_format=tags)
    assert says in str(error.value.body) and "response_format" in str(error.value.body)


def test_a_thought_under_tags_is_split_and_a_budget_cannot_precede_them():
    # The tags hold from the first token (a thought is free text too), so the reasoning parser
    # still splits the answer; a thinking budget, which needs the constraint after the thought, is
    # a 400.
    qwen3 = FORMATS["qwen3"]
    tags = StructuredOutput("structural_tag", {k: v for k, v in TAGS.items() if k != "type"})
    params = SamplingParams(structured_output=tags)
    assert reasoning_for(qwen3, params, ToolUse([], "none")) is qwen3
    assert held_after_reasoning(qwen3, tags) is tags
    with pytest.raises(APIError) as error:
        thinking_constraint(qwen3, tags, 16, required=False, param="thinking_token_budget")
    assert error.value.status_code == 400 and error.value.param == "thinking_token_budget"
