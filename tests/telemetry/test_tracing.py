"""The tracing plugin: request span trees, GenAI/OpenInference attributes, content opt-in, the root span,
errors and aborts, step spans."""

import dataclasses
import itertools
import json

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.plugin_manager import create_plugin_manager
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.telemetry import tracing
from spyglass.telemetry.request_context import HttpRequestInfo, with_info

PROMPT = "The quick brown fox jumps over the lazy dog, again and again and again"
CONTENT_KEYS = ("input.value", "output.value", "gen_ai.input.messages", "gen_ai.output.messages")


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def children(spans, parent):
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def test_output_controls_are_in_the_invocation_parameters(
    span_exporter, make_engine, run_to_completion
):
    engine = make_engine()
    params = SamplingParams(
        max_tokens=4,
        min_tokens=2,
        stop_token_ids=[5],
        allowed_token_ids=[5, 6, 7],
        bad_words=["never"],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        truncate_prompt_tokens=64,
        prompt_logprobs=1,
        cache_salt="tenant-secret",
    )
    engine.add_request("controls", engine.tokenizer.encode(PROMPT), params)
    run_to_completion(engine)
    (span,) = [
        s for s in span_exporter.get_finished_spans() if s.attributes.get("spyglass.request.id")
    ]
    invocation = json.loads(span.attributes["llm.invocation_parameters"])
    assert {
        k: invocation[k] for k in invocation if k not in ("max_tokens", "temperature", "top_p")
    } == {
        "prompt_logprobs": 1,
        "min_tokens": 2,
        "stop_token_ids": [5],
        "num_allowed_token_ids": 3,
        "num_bad_words": 1,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "truncate_prompt_tokens": 64,
        "cache_salted": True,
    }
    assert not any("tenant-secret" in str(v) for v in span.attributes.values())


def test_request_span_tree_attributes_and_step_links(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(trace_steps=True)
    engine = make_engine(max_num_batched_tokens=8)  # forces chunked prefill
    model = engine.model_name
    prompt_ids = engine.tokenizer.encode(PROMPT)
    assert len(prompt_ids) > 8
    http_span = TracerProvider().get_tracer("test").start_span("POST /v1/chat/completions")
    http_context = trace.set_span_in_context(http_span)
    params = SamplingParams(
        max_tokens=5, temperature=0.7, top_p=0.9, top_k=40, seed=7, ignore_eos=True
    )
    engine.add_request(
        "chat-1",
        prompt_ids,
        params,
        prompt=PROMPT,
        attributes={"operation": "chat", "otel_context": http_context, "stream": True},
    )
    engine.add_request(
        "cmpl-2", prompt_ids[:3], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    )
    run_to_completion(engine)
    spans = span_exporter.get_finished_spans()

    (chat,) = by_name(spans, f"chat {model}")
    (completion,) = by_name(spans, f"text_completion {model}")
    assert chat.parent.span_id == http_span.get_span_context().span_id
    assert chat.context.trace_id == http_span.get_span_context().trace_id
    assert completion.parent is None  # offline use: a trace of its own

    a = chat.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "spyglass"
    assert a["gen_ai.request.model"] == model and a["llm.model_name"] == model
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"]) == (5, 0.7)
    assert (a["gen_ai.request.top_p"], a["gen_ai.request.top_k"], a["gen_ai.request.seed"]) == (
        0.9,
        40,
        7,
    )
    assert a["gen_ai.request.stream"] is True and a["gen_ai.response.id"] == "chat-1"
    assert a["gen_ai.usage.input_tokens"] == a["llm.token_count.prompt"] == len(prompt_ids)
    assert a["gen_ai.usage.output_tokens"] == a["llm.token_count.completion"] == 5
    assert a["llm.token_count.total"] == len(prompt_ids) + 5
    assert (
        a["gen_ai.usage.cache_read.input_tokens"]
        == a["llm.token_count.prompt_details.cache_read"]
        == 0
    )
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("length",)
    assert a["openinference.span.kind"] == "LLM"
    assert json.loads(a["llm.invocation_parameters"])["seed"] == 7
    assert a["langfuse.observation.completion_start_time"].endswith("+00:00")
    for key in (
        "time_in_queue",
        "time_to_first_token",
        "time_in_model_prefill",
        "time_in_model_decode",
        "e2e",
    ):
        assert a[f"gen_ai.latency.{key}"] >= 0
    assert not any(key in a for key in CONTENT_KEYS) and not any(
        k.startswith("llm.input_messages") for k in a
    )
    assert [e.name for e in chat.events] == ["first_token", "finished"]

    phases = sorted(children(spans, chat), key=lambda s: s.start_time)
    assert [s.name for s in phases] == ["queue", "prefill", "decode"]
    assert chat.start_time == phases[0].start_time and phases[-1].end_time == chat.end_time
    for earlier, later in itertools.pairwise(phases):
        assert earlier.end_time == later.start_time
    chunks = [e for e in phases[1].events if e.name == "prefill_chunk"]
    assert len(chunks) >= 2
    assert sum(e.attributes["spyglass.num_tokens"] for e in chunks) == len(prompt_ids)
    first_token_event = next(e for e in chat.events if e.name == "first_token")
    assert phases[1].end_time == first_token_event.timestamp

    steps = by_name(spans, "engine_step")
    step_ids = sorted(s.attributes["spyglass.step.id"] for s in steps)
    assert step_ids == list(range(step_ids[0], step_ids[0] + len(steps)))
    # Every token but each request's last sampled one went through a step.
    assert (
        sum(s.attributes["spyglass.step.num_scheduled_tokens"] for s in steps)
        == len(prompt_ids) + 4 + 3 + 2
    )
    request_contexts = {(s.context.trace_id, s.context.span_id) for s in (chat, completion)}
    linked = {
        (link.context.trace_id, link.context.span_id) for step in steps for link in step.links
    }
    assert linked == request_contexts
    # One engine_steps trace for the busy period (it ended idle), not a trace per step.
    (group,) = by_name(spans, "engine_steps")
    assert group.parent is None and group.attributes["spyglass.steps.num_steps"] == len(steps)
    assert group.start_time == min(s.start_time for s in steps) and group.end_time == max(
        s.end_time for s in steps
    )
    for step in steps:
        assert step.parent.span_id == group.context.span_id
        assert step.attributes["spyglass.step.batch_size"] == len(step.links)
        assert step.attributes["spyglass.step.num_scheduled_tokens"] <= 8
    assert sum(s.attributes["spyglass.step.num_generated_tokens"] for s in steps) == 5 + 3
    # Stepping in turn (the CPU's default): no step was launched behind another.
    assert not any(s.attributes["spyglass.step.scheduled_ahead"] for s in steps)
    # No CUDA graphs on the CPU: every forward ran eagerly.
    assert {
        (s.attributes["spyglass.step.forward"], s.attributes["spyglass.step.graph_tokens"])
        for s in steps
    } == {("eager", 0)}


def test_content_only_when_opted_in(use_settings, span_exporter, make_engine, run_to_completion):
    use_settings(trace_content=True)
    engine = make_engine()
    messages = [{"role": "user", "content": "Say hi"}]
    engine.add_request(
        "c",
        engine.tokenizer.encode(PROMPT),
        SamplingParams(max_tokens=4, temperature=0),
        prompt=PROMPT,
        attributes={"operation": "chat", "messages": messages},
    )
    engine.add_request(
        "t",
        engine.tokenizer.encode(PROMPT),
        SamplingParams(max_tokens=4, temperature=0),
        prompt=PROMPT,
    )
    # A vision model's conversation, as the API leaves it: image parts without their bytes.
    parts = [{"type": "image"}, {"type": "text", "text": "What is it?"}]
    engine.add_request(
        "v",
        engine.tokenizer.encode(PROMPT),
        SamplingParams(max_tokens=1),
        prompt=PROMPT,
        attributes={"operation": "chat", "messages": [{"role": "user", "content": parts}]},
    )
    outputs = run_to_completion(engine)
    spans = {s.attributes.get("gen_ai.response.id"): s for s in span_exporter.get_finished_spans()}
    chat, text = spans["c"].attributes, spans["t"].attributes
    assert text["input.value"] == PROMPT
    assert text["output.value"] == engine.tokenizer.decode(outputs["t"].outputs[0].token_ids)
    assert text["llm.output_messages.0.message.role"] == "assistant"
    assert (
        json.loads(text["gen_ai.output.messages"])[0]["parts"][0]["content"] == text["output.value"]
    )
    assert chat["llm.input_messages.0.message.content"] == "Say hi"
    assert json.loads(chat["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Say hi"}]}
    ]
    assert not any(".message.contents." in key for key in chat)
    vision = spans["v"].attributes
    contents = "llm.input_messages.0.message.contents"
    assert vision[f"{contents}.0.message_content.type"] == "image"
    assert vision[f"{contents}.1.message_content.type"] == "text"
    assert vision[f"{contents}.1.message_content.text"] == "What is it?"
    assert vision["llm.input_messages.0.message.content"] == "What is it?"


def test_preemption_and_resumption_spans(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings()
    engine = make_engine(num_kv_blocks=4, block_size=16)  # 64 token slots for two requests of 50
    prompt_ids = engine.tokenizer.encode(PROMPT)[:20]
    for req_id in ("a", "b"):
        engine.add_request(
            req_id, prompt_ids, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
        )
    run_to_completion(engine)
    spans = span_exporter.get_finished_spans()
    requests = [s for s in spans if s.name.startswith("text_completion")]
    victim = next(s for s in requests if s.attributes["spyglass.num_preemptions"] > 0)
    phases = sorted(children(spans, victim), key=lambda s: s.start_time)
    names = [s.name for s in phases]
    assert names[:3] == ["queue", "prefill", "decode"] and "preempted" in names
    after = names[names.index("preempted") + 1 :]
    assert after[:2] == ["prefill", "decode"]
    assert phases[names.index("preempted") + 1].attributes["spyglass.resumed"] is True
    assert {"preempted", "resumed"} <= {e.name for e in victim.events}
    assert victim.attributes["gen_ai.usage.output_tokens"] == 30


def test_abort_and_no_spans_when_tracing_is_off(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(tracing=False)
    engine = make_engine()
    engine.add_request("x", [1, 2, 3], SamplingParams(max_tokens=3))
    run_to_completion(engine)
    assert span_exporter.get_finished_spans() == ()

    use_settings()
    engine = make_engine()
    engine.add_request("y", [1, 2, 3], SamplingParams(max_tokens=50))
    engine.step()
    engine.abort("y")
    (span,) = [
        s for s in span_exporter.get_finished_spans() if s.name.startswith("text_completion")
    ]
    assert tuple(span.attributes["gen_ai.response.finish_reasons"]) == ("abort",)
    assert all(s.end_time is not None for s in span_exporter.get_finished_spans())


def server_context(span_exporter, session_id=None):
    """A SERVER span and the context the telemetry middleware would hand the API, as it does per request."""
    tracer = tracing.get_tracer()
    server = tracer.start_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER)
    info = HttpRequestInfo("req-from-client", session_id, "127.0.0.1", 8000)
    return server, with_info(info, trace.set_span_in_context(server))


def test_root_span_carries_kind_user_session_and_content(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(trace_content=True, served_model_name="tiny")
    engine = make_engine()
    server, context = server_context(span_exporter, session_id="session-from-header")
    messages = [{"role": "user", "content": "Say hi"}]
    attributes = {
        "operation": "chat",
        "otel_context": context,
        "user": "alice",
        "messages": messages,
    }
    attributes |= {"api_request_id": "chatcmpl-1", "session_id": "session-from-metadata"}
    for index in range(2):  # n=2: choice 0 speaks for the call
        engine.add_request(
            f"chatcmpl-1-{index}",
            engine.tokenizer.encode(PROMPT),
            SamplingParams(max_tokens=3, seed=index),
            PROMPT,
            attributes,
        )
    outputs = run_to_completion(engine)
    server.end()
    spans = span_exporter.get_finished_spans()
    (root,) = by_name(spans, "POST /v1/chat/completions")
    a = root.attributes
    assert a["openinference.span.kind"] == "CHAIN" and a["langfuse.trace.name"] == "chat tiny"
    assert (
        a["user.id"] == "alice" and a["session.id"] == "session-from-header"
    )  # the header wins over metadata
    assert json.loads(a["input.value"]) == messages and a["input.mime_type"] == "application/json"
    assert a["output.value"] == outputs["chatcmpl-1-0"].outputs[0].text
    llm = by_name(spans, "chat tiny")
    assert len(llm) == 2 and all(s.parent.span_id == root.context.span_id for s in llm)
    for span in llm:
        assert (
            span.attributes["server.address"] == "127.0.0.1"
            and span.attributes["server.port"] == 8000
        )
        assert span.attributes["spyglass.http.request_id"] == "req-from-client"
        assert (
            span.attributes["session.id"] == "session-from-header"
            and span.attributes["user.id"] == "alice"
        )
        assert span.end_time <= root.end_time


def test_abort_after_the_response_ended_is_marked_and_ends_inside_it(
    use_settings, span_exporter, make_engine
):
    use_settings()
    engine = make_engine()
    server, context = server_context(span_exporter)
    engine.add_request(
        "gone", [1, 2, 3], SamplingParams(max_tokens=50), attributes={"otel_context": context}
    )
    server.end()  # the client went away and the response ended; the engine hears of it later
    engine.step()
    engine.step()
    engine.abort("gone")
    spans = span_exporter.get_finished_spans()
    (root,) = by_name(spans, "POST /v1/chat/completions")
    (llm,) = [s for s in spans if s.name.startswith("text_completion")]
    assert llm.attributes["error.type"] == "abort"
    assert (
        llm.status.status_code == trace.StatusCode.UNSET
    )  # the client's doing, not a server error
    assert all(s.start_time <= s.end_time <= root.end_time for s in spans if s is not root)
    assert [s.name for s in children(spans, llm)] == [
        "queue"
    ]  # no phase opens after the response ended
    assert "output.value" not in root.attributes


class PoisonedPrefixCache:
    """Fails the prefix lookup of requests whose prompt starts with token 7."""

    @hookimpl
    def spyglass_match_prefix(self, request, block_pool, block_size):
        if request.prompt_token_ids[0] == 7:
            raise KeyError("corrupt index")
        return None


def test_engine_failure_sets_error_status_type_and_exception(
    use_settings, span_exporter, tiny_llama_dir
):
    use_settings()
    pm = create_plugin_manager()
    pm.register(PoisonedPrefixCache(), name="poisoned")
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32"), plugin_manager=pm)
    server, context = server_context(span_exporter)
    engine.add_request(
        "bad", [7, 8, 9], SamplingParams(max_tokens=3), attributes={"otel_context": context}
    )
    while engine.has_unfinished_requests:
        engine.step()
    server.end()
    engine.shutdown()
    spans = span_exporter.get_finished_spans()
    (llm,) = [s for s in spans if s.name.startswith("text_completion")]
    (root,) = by_name(spans, "POST /v1/chat/completions")
    for span in (
        llm,
        root,
    ):  # a streamed response is 200 already: the root says the generation failed
        assert (
            span.status.status_code == trace.StatusCode.ERROR
            and "corrupt index" in span.status.description
        )
        assert span.attributes["error.type"] == "KeyError"
        (exception,) = [e for e in span.events if e.name == "exception"]
        assert exception.attributes["exception.type"] == "KeyError"


def test_step_spans_rotate_into_a_new_trace_per_interval(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(trace_steps=True, trace_steps_interval_s=1e-9)  # every step starts a new interval
    engine = make_engine()
    engine.add_request("s", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    run_to_completion(engine)
    spans = span_exporter.get_finished_spans()
    steps, groups = by_name(spans, "engine_step"), by_name(spans, "engine_steps")
    assert len(steps) == len(groups) == 4
    assert {s.parent.span_id for s in steps} == {g.context.span_id for g in groups}
    assert all(g.parent is None and g.attributes["spyglass.steps.num_steps"] == 1 for g in groups)


def test_a_predicted_output_is_traced_by_its_length_and_the_drafts_it_gave(
    span_exporter, make_engine, run_to_completion
):
    engine = make_engine(speculative="ngram", num_speculative_tokens=4)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = engine.tokenizer.encode(PROMPT)
    engine.add_request("plain", prompt, greedy)
    answer = run_to_completion(engine)["plain"].outputs[0].token_ids
    engine.add_request("predicted", prompt, dataclasses.replace(greedy, prediction=answer))
    final = run_to_completion(engine)["predicted"]
    (span,) = [
        s
        for s in span_exporter.get_finished_spans()
        if s.attributes.get("spyglass.request.id") == "predicted"
    ]
    invocation = json.loads(span.attributes["llm.invocation_parameters"])
    assert invocation["num_prediction_tokens"] == len(answer)
    assert not any(str(answer) in str(v) for v in span.attributes.values())
    accepted = span.attributes["spyglass.spec.num_accepted_tokens"]
    assert accepted == final.metrics["num_accepted_tokens"] >= len(answer) // 2
