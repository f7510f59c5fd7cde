"""End to end: engine spans exported over OTLP (HTTP and gRPC) land in a real Phoenix, in the named project."""

import uuid

import pytest

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.telemetry import tracing
from spyglass.telemetry.settings import TelemetrySettings

PROMPT = "Tell me about lighthouses"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_request_spans_reach_phoenix(
    phoenix, protocol, monkeypatch, use_settings, make_engine, run_to_completion
):
    project = f"spyglass-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OTEL_SERVICE_NAME", project)
    endpoint = phoenix.http_traces if protocol == "http/protobuf" else phoenix.grpc
    settings = TelemetrySettings(
        otlp_traces_endpoint=endpoint, otlp_protocol=protocol, trace_content=True
    )
    provider = tracing.build_tracer_provider(settings)
    assert provider.resource.attributes["openinference.project.name"] == project
    tracing.set_tracer_provider(provider)
    try:
        use_settings(otlp_traces_endpoint=endpoint, otlp_protocol=protocol, trace_content=True)
        engine = make_engine()
        prompt_ids = engine.tokenizer.encode(PROMPT)
        engine.add_request(
            "p1",
            prompt_ids,
            SamplingParams(max_tokens=4, ignore_eos=True),
            PROMPT,
            attributes={"operation": "chat"},
        )
        run_to_completion(engine)
        assert provider.force_flush(30_000)
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()

    spans = phoenix.spans(project, expected=4)  # request, queue, prefill, decode
    (llm,) = [s for s in spans if s["name"] == f"chat {engine.model_name}"]
    attributes = llm["attributes"]
    assert llm["span_kind"] == "LLM"
    assert attributes["llm.token_count.prompt"] == len(prompt_ids)
    assert attributes["llm.token_count.completion"] == 4
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["input.value"] == PROMPT
    children = {s["name"] for s in spans if s.get("parent_id") == llm["context"]["span_id"]}
    assert children == {"queue", "prefill", "decode"}
