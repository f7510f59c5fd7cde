"""Structured outputs and tools are visible: span attributes for the response format and tool
definitions, and metrics for grammar compile time and per-step mask time."""

import json

from prometheus_client import REGISTRY

from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from spyglass.plugins.think_reasoning import FORMATS

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _count(name: str, engine) -> float:
    labels = {"model_name": engine.model_name, "engine": engine.info.engine_id}
    return REGISTRY.get_sample_value(f"{name}_count", labels) or 0.0


def test_response_format_and_tools_on_spans_and_grammar_timings_in_metrics(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings()
    engine = make_engine()
    constrained = SamplingParams(
        max_tokens=12, temperature=0, structured_output=StructuredOutput("json_schema", SCHEMA)
    )
    prompt_ids = engine.tokenizer.encode("Where is it warm?")
    engine.add_request(
        "with-schema-1",
        prompt_ids,
        constrained,
        attributes={"operation": "chat", "tools": [WEATHER_TOOL]},
    )
    engine.add_request("with-schema-2", prompt_ids, constrained)  # the same schema: compiled once
    engine.add_request("plain", prompt_ids, SamplingParams(max_tokens=3, temperature=0))
    reasoned = StructuredOutput(
        "json_schema", SCHEMA, after_reasoning=FORMATS["qwen3"].reasoning_rules(3, required=True)
    )
    engine.add_request(
        "after-thinking",
        prompt_ids,
        SamplingParams(max_tokens=12, temperature=0, structured_output=reasoned),
        attributes={"operation": "chat", "thinking_budget": 3},
    )
    outputs = run_to_completion(engine)

    spans = {s.attributes.get("spyglass.request.id"): s for s in span_exporter.get_finished_spans()}
    a = spans["with-schema-1"].attributes
    assert a["spyglass.response_format"] == "json_schema" and a["gen_ai.output.type"] == "json"
    assert json.loads(a["spyglass.response_format.spec"]) == SCHEMA
    assert json.loads(a["llm.tools.0.tool.json_schema"]) == WEATHER_TOOL
    assert json.loads(a["gen_ai.tool.definitions"]) == [WEATHER_TOOL]
    assert "llm.tools.0.tool.json_schema" not in spans["with-schema-2"].attributes
    assert "spyglass.response_format" not in spans["plain"].attributes
    assert "spyglass.response_format.after_reasoning" not in a
    thought = spans["after-thinking"].attributes
    assert thought["spyglass.response_format.after_reasoning"] is True
    assert thought["spyglass.request.thinking_budget"] == 3

    assert _count("spyglass:structured_output_compile_seconds", engine) == 2  # two distinct specs
    # Every step that sampled for a constrained request filled masks: one per output token at least.
    num_tokens = len(outputs["with-schema-1"].outputs[0].token_ids)
    assert (
        num_tokens > 0 and _count("spyglass:structured_output_mask_seconds", engine) >= num_tokens
    )
