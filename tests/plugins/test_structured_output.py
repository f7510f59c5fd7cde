"""Structured outputs through the llguidance plugin: every output matches its constraint, whatever the model.

The tiny model has random weights, so its unconstrained output is noise: constrained output that
still matches shows the mask, not the model, did the work. The default model shows real JSON.
"""

import dataclasses
import json
import re

import jsonschema
import pytest

from spyglass import LLM, StructuredOutputsParams
from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    SamplingParams,
    StructuredOutput,
)
from spyglass.plugins.hermes_tool_parser import HermesToolCallParser
from spyglass.plugins.structured_output import grammar_text, json_options

PLUGINS = ("fcfs", "structured_output")
PROMPT = list(range(100, 120))

CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "kind": {"enum": ["capital", "town", "village"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "area_km2": {"type": "number", "minimum": 0, "maximum": 10000},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
        "mayor": {"type": "string", "maxLength": 20},
    },
    "required": ["city", "kind", "population", "landmarks"],
    "additionalProperties": False,
}


def _params(
    spec: StructuredOutput, seed: int, temperature: float = 1.0, max_tokens: int = 200
) -> SamplingParams:
    return SamplingParams(
        temperature=temperature, seed=seed, max_tokens=max_tokens, structured_output=spec
    )


@pytest.mark.parametrize(
    "spec, matches",
    [
        (
            StructuredOutput("regex", r"[0-9]{3}-[a-z]{2,4}"),
            lambda text: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text),
        ),
        (
            StructuredOutput("choice", ["red", "green", "blue"]),
            lambda text: text in ("red", "green", "blue"),
        ),
        (
            StructuredOutput("grammar", 'start: "(" NUMBER ("+" NUMBER)* ")"\nNUMBER: /[1-9]/'),
            lambda text: re.fullmatch(r"\([1-9](\+[1-9])*\)", text),
        ),
    ],
    ids=["regex", "choice", "lark"],
)
def test_random_model_output_always_matches(make_engine, driver, spec, matches):
    engine = make_engine(plugins=PLUGINS)
    requests = [driver.add(engine, PROMPT, _params(spec, seed)) for seed in range(20)]
    outputs = driver.drain(engine)
    for request in requests:
        output = outputs[request.req_id].outputs[0]
        if output.finish_reason == "stop":
            assert matches(output.text), output.text
    assert sum(outputs[r.req_id].outputs[0].finish_reason == "stop" for r in requests) >= 15
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks


def test_default_model_json_schema_is_valid_twenty_times_of_twenty(make_default_engine, driver):
    engine = make_default_engine(plugins=PLUGINS)
    tokenizer = engine.tokenizer
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": "Describe Lyon as JSON."}])
    )
    spec = StructuredOutput("json_schema", CITY_SCHEMA)
    requests = [
        driver.add(engine, prompt, _params(spec, seed, temperature=0.0 if seed < 2 else 0.8))
        for seed in range(20)
    ]
    outputs = driver.drain(engine)
    for request in requests:
        output = outputs[request.req_id].outputs[0]
        assert output.finish_reason == "stop", output.text
        jsonschema.validate(json.loads(output.text), CITY_SCHEMA)


def test_json_object_always_parses(make_default_engine, driver):
    engine = make_default_engine(plugins=PLUGINS)
    tokenizer = engine.tokenizer
    spec = StructuredOutput("json_object")
    questions = (
        'Return {"name": "Bob", "age": 30} as JSON.',
        "A JSON object with the keys city and country for Paris.",
    )
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}]))
        for q in questions
    ]
    requests = [
        driver.add(engine, prompt, _params(spec, 0, temperature=0.0, max_tokens=300))
        for prompt in prompts
    ]
    outputs = driver.drain(engine)
    for request in requests:
        assert outputs[request.req_id].outputs[0].finish_reason == "stop"
        assert isinstance(json.loads(outputs[request.req_id].outputs[0].text), dict)


def test_speculative_decoding_with_a_schema_gives_the_same_output(make_default_engine, driver):
    # Greedy, float32: drafts are trimmed to the grammar and verified under its masks, so the output
    # is exactly the non-speculative one.
    spec = StructuredOutput("json_schema", CITY_SCHEMA)
    texts = {}
    for method in (None, "ngram"):
        engine = make_default_engine(plugins=(*PLUGINS, "ngram"), speculative=method)
        tokenizer = engine.tokenizer
        question = 'Repeat exactly: {"city": "Lyon", "kind": "town", "population": 500000, "landmarks": ["Fourviere"]}'
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": question}])
        )
        request = driver.add(engine, prompt, _params(spec, 0, temperature=0.0))
        texts[method] = driver.drain(engine)[request.req_id].outputs[0].text
        if method:
            assert request.num_draft_tokens > 0 and request.num_accepted_tokens > 0
    assert texts["ngram"] == texts[None]
    jsonschema.validate(json.loads(texts[None]), CITY_SCHEMA)


def test_preemption_keeps_the_constrained_output(make_engine, driver):
    spec = StructuredOutput("regex", r"(ab|cd|ef){5,8}")
    baseline = make_engine(plugins=PLUGINS, num_kv_blocks=256)
    expected = [
        driver.add(baseline, PROMPT[: 8 + i], _params(spec, i, 0.0, max_tokens=30))
        for i in range(6)
    ]
    outputs = driver.drain(baseline)
    want = [outputs[r.req_id].outputs[0].text for r in expected]
    tight = make_engine(plugins=PLUGINS, num_kv_blocks=14)
    requests = [
        driver.add(tight, PROMPT[: 8 + i], _params(spec, i, 0.0, max_tokens=30)) for i in range(6)
    ]
    outputs = driver.drain(tight)
    assert sum(r.num_preemptions for r in requests) > 0
    assert [outputs[r.req_id].outputs[0].text for r in requests] == want
    assert all(re.fullmatch(r"(ab|cd|ef){5,8}", text) for text in want)


def test_logit_bias_forces_and_forbids_tokens(make_engine, driver):
    engine = make_engine(plugins=("fcfs",))
    plain = driver.add(
        engine, PROMPT, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    )
    forced = driver.add(
        engine,
        PROMPT,
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logit_bias={7: 100}),
    )
    outputs = driver.drain(engine)
    greedy = outputs[plain.req_id].outputs[0].token_ids
    assert outputs[forced.req_id].outputs[0].token_ids == [7, 7, 7, 7]
    banned = driver.add(
        engine,
        PROMPT,
        SamplingParams(
            temperature=0.0, max_tokens=4, ignore_eos=True, logit_bias={greedy[0]: -100}
        ),
    )
    assert driver.drain(engine)[banned.req_id].outputs[0].token_ids[0] != greedy[0]
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        driver.add(engine, PROMPT, SamplingParams(logit_bias={10**9: 1.0}))
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        SamplingParams(logit_bias={7: 101.0})


def test_invalid_specs_and_missing_backend_are_request_errors(make_engine, driver):
    engine = make_engine(plugins=PLUGINS)
    for spec in (
        StructuredOutput("regex", "(unclosed"),
        StructuredOutput(
            "json_schema", {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
        ),
        StructuredOutput("choice", []),
        StructuredOutput("grammar", "start: undefined_rule"),
    ):
        with pytest.raises(InvalidRequestError) as error:
            driver.add(engine, PROMPT, _params(spec, 0))
        assert error.value.param == "response_format"
    without = make_engine(plugins=("fcfs",))
    with pytest.raises(InvalidRequestError, match="no"):
        driver.add(without, PROMPT, _params(StructuredOutput("json_object"), 0))
    assert not engine.requests and not without.requests


def test_each_engine_has_its_own_backend_instance(make_engine):
    first, second = make_engine(plugins=PLUGINS), make_engine(plugins=PLUGINS)
    assert first.plugin_manager.get_plugin(
        "structured_output"
    ) is not second.plugin_manager.get_plugin("structured_output")


def test_a_constraint_the_vocabulary_cannot_start_is_refused(make_engine, driver):
    # SmolLM2's byte-level vocabulary has no token for the lead byte of U+40000: nothing can begin this choice.
    engine = make_engine(plugins=PLUGINS)
    with pytest.raises(InvalidRequestError, match="vocabulary") as error:
        driver.add(engine, PROMPT, _params(StructuredOutput("choice", ["\U00040000"]), 0))
    assert error.value.param == "response_format" and not engine.requests


def test_a_constraint_whose_forced_text_the_vocabulary_cannot_spell_is_refused(make_engine, driver):
    # "0" can start it, but the lead byte of U+40000 that must follow has no token (found by fuzzing:
    # the grammar's mask offered a continuation byte there, and then rejected it).
    engine = make_engine(plugins=PLUGINS)
    with pytest.raises(InvalidRequestError, match="cannot spell") as error:
        driver.add(engine, PROMPT, _params(StructuredOutput("regex", "0\U00040000"), 0))
    assert error.value.param == "response_format" and not engine.requests


def test_choices_beyond_the_bmp_are_written_and_unspellable_ones_refused(make_engine, driver):
    # Found by fuzzing: a choice the vocabulary cannot spell led the grammar into a dead end after
    # its first character (its mask offered a continuation byte, then it rejected it: a 500).
    engine = make_engine(plugins=PLUGINS)
    choices = ["a\U0001f600", "b\U0001d518"]  # an emoji and a mathematical letter
    requests = [
        driver.add(engine, PROMPT, _params(StructuredOutput("choice", choices), seed))
        for seed in range(10)
    ]
    outputs = driver.drain(engine)
    assert {outputs[r.req_id].outputs[0].finish_reason for r in requests} == {"stop"}
    assert {outputs[r.req_id].outputs[0].text for r in requests} <= set(choices)
    # SmolLM2's vocabulary has no token for U+4EF1E's lead byte: "0" could start that choice,
    # but nothing could finish it.
    with pytest.raises(InvalidRequestError, match="cannot spell the choice") as error:
        driver.add(engine, PROMPT, _params(StructuredOutput("choice", ["a", "0\U0004ef1e"]), 0))
    assert error.value.param == "response_format"


def test_vllms_structured_outputs_spelling_constrains_alike_offline(tiny_llama_dir):
    # vLLM's SamplingParams(structured_outputs=StructuredOutputsParams(...)) is our
    # structured_output: the same sampled text, and a constraint that a replace keeps.
    llm = LLM(model=str(tiny_llama_dir), device="cpu", dtype="float32")
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    spellings = {
        "ours": {"structured_output": StructuredOutput("regex", pattern)},
        "vllm": {"structured_outputs": StructuredOutputsParams(regex=pattern)},
    }
    texts = {}
    for name, spelling in spellings.items():
        params = SamplingParams(temperature=1.0, seed=3, max_tokens=40, **spelling)
        [output] = llm.generate({"prompt_token_ids": PROMPT}, params)
        texts[name] = output.outputs[0].text
    assert re.fullmatch(pattern, texts["vllm"]) and texts["ours"] == texts["vllm"]
    params = SamplingParams(
        structured_outputs=StructuredOutputsParams(json=json.dumps(CITY_SCHEMA))
    )
    assert params.structured_output == StructuredOutput("json_schema", CITY_SCHEMA)
    kept = dataclasses.replace(params, max_tokens=5)
    assert kept.structured_output == params.structured_output
    refused = [
        {"structured_outputs": StructuredOutputsParams()},
        {"structured_outputs": StructuredOutputsParams(regex="a", choice=["b"])},
        {"structured_outputs": StructuredOutputsParams(json="{not json")},
        {
            "structured_outputs": StructuredOutputsParams(json_object=True),
            "structured_output": StructuredOutput("regex", "a"),
        },
    ]
    for options in refused:
        with pytest.raises(InvalidRequestError) as error:
            SamplingParams(**options)
        assert error.value.param == "structured_outputs"


def _loose_whitespace(text: str) -> int:
    """How many whitespace characters of JSON ``text`` lie outside its strings other than one
    space after a ``,`` or ``:``."""
    loose, in_string, escaped = 0, False, False
    for index, char in enumerate(text):
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
        elif char == '"':
            in_string = True
        elif char.isspace() and not (char == " " and index and text[index - 1] in ",:"):
            loose += 1
    return loose


def test_compact_json_whitespace_leaves_a_weak_model_no_room_for_loose_whitespace(
    make_engine, driver
):
    # --plugin-option json_whitespace=compact (vLLM's disable_any_whitespace): only ", " and ": ".
    # The random model, given any whitespace (the default), writes plenty of it.
    loose = {}
    for whitespace in ("flexible", "compact"):
        engine = make_engine(plugins=PLUGINS, plugin_options={"json_whitespace": whitespace})
        spec = StructuredOutput("json_schema", CITY_SCHEMA)
        requests = [driver.add(engine, PROMPT, _params(spec, s, max_tokens=80)) for s in range(8)]
        outputs = driver.drain(engine)
        texts = [outputs[r.req_id].outputs[0].text for r in requests]
        loose[whitespace] = sum(map(_loose_whitespace, texts))
        for text, request in zip(texts, requests):
            if outputs[request.req_id].outputs[0].finish_reason == "stop":
                jsonschema.validate(json.loads(text), CITY_SCHEMA)
    assert loose["compact"] == 0 < loose["flexible"]
    with pytest.raises(ValueError, match="json_whitespace must be one of"):
        make_engine(plugins=PLUGINS, plugin_options={"json_whitespace": "tight"})


def _longest_gap(text: str) -> int:
    """The longest run of whitespace between two tokens of JSON ``text`` (outside its strings)."""
    longest = run = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
            continue
        in_string = char == '"'
        run = run + 1 if char.isspace() else 0
        longest = max(longest, run)
    return longest


def test_flexible_json_whitespace_is_bounded_between_two_tokens(
    make_engine, driver, grammar_accepts
):
    # Any whitespace, as vLLM allows, but a weak model cannot write it for ever: at most
    # json_max_whitespace characters (64) between two tokens, then it must go on.
    # Walked through the masks inside a structural tag (a Lark grammar) holding the JSON.
    structure = {"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}
    spec = StructuredOutput("structural_tag", {"structures": [structure], "triggers": ["<a>"]})
    grammar = grammar_text(spec)
    assert grammar_accepts(grammar, "<a>{\n" + " " * 63 + '"a": 1}</a>')
    assert not grammar_accepts(grammar, "<a>{\n" + " " * 64 + '"a": 1}</a>')
    narrow = grammar_text(spec, json_options("flexible", 4))
    assert grammar_accepts(narrow, '<a>{"a":    1}</a>')
    assert not grammar_accepts(narrow, '<a>{"a":     1}</a>')
    # The random model, which pads JSON with all the whitespace it may, stays within the bound.
    engine = make_engine(plugins=PLUGINS, plugin_options={"json_max_whitespace": "6"})
    spec = StructuredOutput("json_schema", CITY_SCHEMA)
    requests = [driver.add(engine, PROMPT, _params(spec, s, max_tokens=80)) for s in range(8)]
    outputs = driver.drain(engine)
    gaps = [_longest_gap(outputs[r.req_id].outputs[0].text) for r in requests]
    assert max(gaps) == 6  # reached, never passed
    with pytest.raises(ValueError, match="json_max_whitespace must be a whole number"):
        make_engine(plugins=PLUGINS, plugin_options={"json_max_whitespace": "0"})


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}


def _call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one call"])
def test_the_hermes_strict_grammar_holds_calls_and_leaves_text_free(grammar_accepts, parallel):
    # OpenAI's strict functions with tool_choice auto: any text, but a <tool_call> the model
    # opens must be a call of an offered function whose arguments obey its schema (a function
    # that is not strict takes any object); after the last call no other opens.
    grammar = HermesToolCallParser().strict_grammar(
        {"get_weather": WEATHER, "get_time": {"type": "object"}}, parallel
    )

    def allowed(text: str) -> bool:
        return grammar_accepts(grammar, text)

    weather, time = _call("get_weather", {"city": "Rome"}), _call("get_time", {"zone": 1})
    assert allowed("No call needed: it is sunny.")
    assert allowed(f"Let me look.\n{weather}")
    assert allowed(f"{weather}\nThat is all.")
    assert allowed(f"{weather}{time}") == parallel  # a second call
    assert not allowed(_call("get_weather", {"town": "Rome"}))  # not its schema
    assert not allowed(_call("get_weather", {"city": "Rome", "days": "two"}))
    assert not allowed(_call("get_news", {}))  # no such function
    assert not allowed("Sure <tool_call>\nget_weather(Rome)")
    assert not allowed(f"{weather} and then <tool_call> again")
