"""A chat answer's tool calls and reasoning on its trace, read as the API reads them: the LLM
span's output messages and the HTTP span's output match what the client received."""

import json
import re
import time

import pytest
from litestar.testing import TestClient

from spyglass.core.api.app import create_app
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.answer_reading import AnswerReading
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from tests.telemetry.test_tracing import PROMPT, by_name, server_context

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# A unit is all the forced call may say: its arguments end, whatever the random model writes.
UNIT = {
    "type": "function",
    "function": {
        "name": "get_unit",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
ARGUMENTS = '{"city": "Oslo"}'
CALL = f'{{"name": "get_weather", "arguments": {ARGUMENTS}}}'
ANSWER = f"<think>cold?</think>Let me look.<tool_call>{CALL}</tool_call>"
TOOL_CALL_KEY = "llm.output_messages.0.message.tool_calls.0.tool_call.function"


def written(engine, req_id: str, text: str, attributes: dict) -> None:
    """Add a chat request whose answer is ``text`` exactly (a regex of it holds the random model)."""
    spec = StructuredOutput("regex", re.escape(text))
    params = SamplingParams(max_tokens=64, temperature=0, structured_output=spec)
    engine.add_request(req_id, engine.tokenizer.encode(PROMPT), params, PROMPT, attributes)


@pytest.mark.parametrize("content", [True, False])
def test_a_reasoned_answer_with_a_call_is_traced_as_its_message(
    content, use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(trace_content=content, served_model_name="tiny")
    engine = make_engine()
    server, context = server_context(span_exporter)
    reading = AnswerReading(reasoning_parser="qwen3", tool_call_parser="hermes")
    attributes = {"operation": "chat", "tools": [WEATHER]}
    written(
        engine, "called", ANSWER, attributes | {"answer_reading": reading, "otel_context": context}
    )
    written(engine, "unread", ANSWER, attributes)  # a request the API does not split
    outputs = run_to_completion(engine)
    server.end()
    assert outputs["called"].outputs[0].text == ANSWER
    spans = span_exporter.get_finished_spans()
    llm = {s.attributes["spyglass.request.id"]: s.attributes for s in by_name(spans, "chat tiny")}
    called, unread = llm["called"], llm["unread"]
    assert called["spyglass.response.num_tool_calls"] == 1
    assert tuple(called["spyglass.response.tool_names"]) == ("get_weather",)
    assert "spyglass.response.num_tool_calls" not in unread
    if not content:
        assert not any(
            key.startswith(("llm.output_messages", "gen_ai.output.messages")) for key in called
        )
        (root,) = by_name(spans, "POST /v1/chat/completions")
        assert "output.value" not in root.attributes
        return
    assert called["output.value"] == ANSWER  # what the model wrote
    assert called["llm.output_messages.0.message.content"] == "Let me look."
    assert called[f"{TOOL_CALL_KEY}.name"] == "get_weather"
    assert json.loads(called[f"{TOOL_CALL_KEY}.arguments"]) == {"city": "Oslo"}
    (message,) = json.loads(called["gen_ai.output.messages"])
    assert message["finish_reason"] == "tool_call"
    assert message["parts"] == [
        {"type": "reasoning", "content": "cold?"},
        {"type": "text", "content": "Let me look."},
        {"type": "tool_call", "name": "get_weather", "arguments": {"city": "Oslo"}},
    ]
    assert unread["llm.output_messages.0.message.content"] == ANSWER
    (root,) = by_name(spans, "POST /v1/chat/completions")
    assert root.attributes["output.mime_type"] == "application/json"
    assert json.loads(root.attributes["output.value"]) == {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "cold?",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
        ],
    }


def test_a_name_outside_the_offered_tools_is_counted_not_recorded(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(served_model_name="tiny")
    engine = make_engine()
    reading = AnswerReading(tool_call_parser="hermes")
    made_up = "<tool_call>" + CALL.replace("get_weather", "tell_secret") + "</tool_call>"
    written(
        engine,
        "made-up",
        made_up,
        {"operation": "chat", "tools": [WEATHER], "answer_reading": reading},
    )
    run_to_completion(engine)
    (span,) = by_name(span_exporter.get_finished_spans(), "chat tiny")
    assert span.attributes["spyglass.response.num_tool_calls"] == 1
    assert "spyglass.response.tool_names" not in span.attributes


def test_served_calls_and_their_results_are_on_the_llm_spans(
    use_settings, span_exporter, tiny_llama_dir
):
    use_settings(trace_content=True, served_model_name="tiny")
    config = EngineConfig(
        model=str(tiny_llama_dir),
        kv_cache_memory=16 << 20,
        num_threads=1,
        plugin_options={"json_whitespace": "compact"},  # the random model writes no padding
    )
    question = {"role": "user", "content": "Which unit?"}
    body = {"model": "tiny", "tools": [WEATHER, UNIT], "max_tokens": 40, "temperature": 0}
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        forced = {"type": "function", "function": {"name": "get_unit"}}
        response = client.post(
            "/v1/chat/completions", json=body | {"messages": [question], "tool_choice": forced}
        )
        assert response.status_code == 200, response.text
        (choice,) = response.json()["choices"]
        (call,) = choice["message"]["tool_calls"]
        result = {"role": "tool", "tool_call_id": call["id"], "content": "celsius it is"}
        messages = [question, choice["message"], result]
        response = client.post(
            "/v1/chat/completions", json=body | {"messages": messages, "max_tokens": 2}
        )
        assert response.status_code == 200, response.text
    first, second = sorted(
        by_name(span_exporter.get_finished_spans(), "chat tiny"), key=lambda s: s.start_time
    )
    a = first.attributes
    assert a["spyglass.response.num_tool_calls"] == 1
    assert tuple(a["spyglass.response.tool_names"]) == ("get_unit",)
    assert a[f"{TOOL_CALL_KEY}.name"] == call["function"]["name"] == "get_unit"
    assert a[f"{TOOL_CALL_KEY}.arguments"] == call["function"]["arguments"]
    assert json.loads(call["function"]["arguments"])["unit"] in ("celsius", "fahrenheit")
    # The round trip: the call the assistant turn made and the result that answers it, by id.
    b = second.attributes
    made = "llm.input_messages.1.message.tool_calls.0.tool_call"
    assert (b[f"{made}.id"], b[f"{made}.function.name"]) == (call["id"], "get_unit")
    assert json.loads(b[f"{made}.function.arguments"]) == json.loads(call["function"]["arguments"])
    assert b["llm.input_messages.2.message.tool_call_id"] == call["id"]
    assert b["llm.input_messages.2.message.content"] == "celsius it is"
    genai = json.loads(b["gen_ai.input.messages"])
    assert genai[1]["parts"] == [
        {
            "type": "tool_call",
            "id": call["id"],
            "name": "get_unit",
            "arguments": json.loads(call["function"]["arguments"]),
        }
    ]
    assert genai[2] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": call["id"], "response": "celsius it is"}],
    }
    assert "spyglass.response.num_tool_calls" not in b  # tools offered, no call made


def test_a_continued_response_names_the_one_it_continues(
    use_settings, span_exporter, tiny_llama_dir
):
    use_settings(served_model_name="tiny")
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    body = {"model": "tiny", "max_output_tokens": 2, "temperature": 0}
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        first = client.post("/v1/responses", json=body | {"input": "Hi."}).json()
        continued = {"input": "Again.", "previous_response_id": first["id"]}
        assert client.post("/v1/responses", json=body | continued).status_code == 200
        conversation = client.post("/v1/conversations", json={}).json()["id"]
        named = {"input": "Within.", "conversation": conversation}
        assert client.post("/v1/responses", json=body | named).status_code == 200
        background = {"input": "Later.", "background": True}
        started = client.post("/v1/responses", json=body | background).json()
        while client.get(f"/v1/responses/{started['id']}").json()["status"] == "in_progress":
            time.sleep(0.05)
    first_span, second_span, in_conversation, third_span = sorted(
        by_name(span_exporter.get_finished_spans(), "chat tiny"), key=lambda s: s.start_time
    )
    # A conversation's calls carry its id (GenAI's attribute): its turns link up in the trace list.
    assert in_conversation.attributes["gen_ai.conversation.id"] == conversation
    assert "gen_ai.conversation.id" not in second_span.attributes
    assert "spyglass.request.previous_response_id" not in first_span.attributes
    assert second_span.attributes["spyglass.request.previous_response_id"] == first["id"]
    # A background call's span says no client connection waited on it.
    assert "spyglass.request.background" not in second_span.attributes
    assert third_span.attributes["spyglass.request.background"] is True


def test_a_stored_chat_completion_says_so(use_settings, span_exporter, tiny_llama_dir):
    use_settings(served_model_name="tiny")
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]}
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        kept = client.post("/v1/chat/completions", json=body | {"store": True}).json()
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    stored, plain = sorted(
        by_name(span_exporter.get_finished_spans(), "chat tiny"), key=lambda s: s.start_time
    )
    assert stored.attributes["spyglass.request.stored"] is True
    assert stored.attributes["gen_ai.response.id"] == kept["id"]  # what GET reads it back by
    assert "spyglass.request.stored" not in plain.attributes


def test_a_batchs_calls_name_their_batch(use_settings, span_exporter, tiny_llama_dir):
    use_settings(served_model_name="tiny")
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        upload = client.post(
            "/v1/files", files={"file": ("in.jsonl", json.dumps(line))}, data={"purpose": "batch"}
        )
        asked = {"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions"}
        batch = client.post("/v1/batches", json=asked | {"completion_window": "24h"}).json()
        while client.get(f"/v1/batches/{batch['id']}").json()["status"] != "completed":
            time.sleep(0.05)
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    batched, plain = sorted(
        by_name(span_exporter.get_finished_spans(), "chat tiny"), key=lambda s: s.start_time
    )
    assert batched.attributes["spyglass.request.batch_id"] == batch["id"]
    assert "spyglass.request.batch_id" not in plain.attributes


def test_a_filled_in_middle_says_so(use_settings, span_exporter, tiny_fim_dir):
    use_settings(served_model_name="tiny")
    config = EngineConfig(model=str(tiny_fim_dir), kv_cache_memory=16 << 20, num_threads=1)
    body = {"model": "tiny", "max_tokens": 2, "prompt": "def f():"}
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        for extra in ({"suffix": "\n    return 1"}, {}):
            assert client.post("/v1/completions", json=body | extra).status_code == 200
    filled, plain = sorted(
        by_name(span_exporter.get_finished_spans(), "text_completion tiny"),
        key=lambda s: s.start_time,
    )
    assert filled.attributes["spyglass.request.fill_in_middle"] is True
    assert "spyglass.request.fill_in_middle" not in plain.attributes


def test_a_truncated_conversation_says_how_many_items_went(
    use_settings, span_exporter, tiny_llama_dir
):
    use_settings(served_model_name="tiny")
    config = EngineConfig(
        model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1, max_model_len=64
    )
    turns = [
        {"role": role, "content": "Tell me about the weather in Lisbon, please."}
        for role in ("user", "assistant") * 3
    ]
    body = {"model": "tiny", "max_output_tokens": 2, "truncation": "auto"}
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        cut = client.post("/v1/responses", json=body | {"input": [*turns, turns[0]]})
        assert cut.status_code == 200, cut.text
        whole = client.post("/v1/responses", json=body | {"input": "Hi."})
        assert whole.status_code == 200, whole.text
    cut_span, whole_span = sorted(
        by_name(span_exporter.get_finished_spans(), "chat tiny"), key=lambda s: s.start_time
    )
    assert cut_span.attributes["spyglass.request.truncated_items"] in (2, 4, 6)
    assert "spyglass.request.truncated_items" not in whole_span.attributes


def test_the_span_says_the_tier_and_the_priority_it_ran_at(
    use_settings, span_exporter, tiny_llama_dir
):
    use_settings(served_model_name="tiny")
    config = EngineConfig(
        model=str(tiny_llama_dir),
        kv_cache_memory=16 << 20,
        num_threads=1,
        scheduling_policy="priority",
    )
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        answer = client.post("/v1/responses", json={"model": "tiny", "input": "Hi",
                                                    "max_output_tokens": 2, "service_tier": "flex"})  # fmt: skip
        assert answer.status_code == 200 and answer.json()["service_tier"] == "flex"
    (span,) = by_name(span_exporter.get_finished_spans(), "chat tiny")
    assert span.attributes["openai.request.service_tier"] == "flex"
    assert json.loads(span.attributes["llm.invocation_parameters"])["priority"] == 1


class BrokenParsers:
    """A tool-call parser plugin whose parser fails on every answer."""

    @hookimpl
    def spyglass_tool_call_parser(self, name):
        return BrokenParser() if name == "broken" else None


class BrokenParser:
    def parse(self, text):
        raise KeyError("a parser's bug")


def test_an_answer_the_parser_fails_on_still_ends_its_span(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(trace_content=True, served_model_name="tiny")
    engine = make_engine()
    engine.plugin_manager.register(BrokenParsers())
    reading = AnswerReading(tool_call_parser="broken")
    written(engine, "broken", ANSWER, {"operation": "chat", "answer_reading": reading})
    run_to_completion(engine)
    (span,) = by_name(span_exporter.get_finished_spans(), "chat tiny")
    assert span.attributes["spyglass.response.read_error"] == "KeyError"
    assert span.attributes["output.value"] == ANSWER  # the text is still there
