"""Pooling requests in telemetry: embeddings as OpenInference EMBEDDING spans (GenAI's
``embeddings`` operation and dimension count), classifications as EVALUATOR spans, neither with
sampling settings, their text and answer only on opt-in; and their metrics."""

import json

from prometheus_client import REGISTRY

from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import pooling_request_params

PROMPT = "Foxes live in forests, deserts and cities"


def _embedding_span(span_exporter, engine, run_to_completion):
    token_ids = engine.tokenizer.encode(PROMPT)
    engine.add_request("e", token_ids, pooling_request_params(PoolingParams()), prompt=PROMPT)
    output = run_to_completion(engine)["e"]
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name.startswith("embeddings ")]
    return span.attributes, output, token_ids


def test_an_embedding_span_names_its_kind_and_size_and_no_sampling(
    span_exporter, make_engine, run_to_completion
):
    engine = make_engine()
    a, output, token_ids = _embedding_span(span_exporter, engine, run_to_completion)
    assert a["gen_ai.operation.name"] == "embeddings"
    assert a["openinference.span.kind"] == "EMBEDDING"
    assert a["embedding.model_name"] == engine.model_name
    assert a["spyglass.embedding.normalize"] is True
    assert a["gen_ai.usage.input_tokens"] == a["llm.token_count.prompt"] == len(token_ids)
    assert a["gen_ai.usage.output_tokens"] == 0
    assert a["gen_ai.embeddings.dimension.count"] == len(output.pooled)
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    for key in ("gen_ai.request.temperature", "gen_ai.request.max_tokens", "llm.model_name"):
        assert key not in a
    assert not [key for key in a if key.startswith("embedding.embeddings.")]
    assert "input.value" not in a


def test_the_text_and_vector_are_traced_only_on_opt_in(
    use_settings, span_exporter, make_engine, run_to_completion
):
    use_settings(trace_content=True)
    a, output, _ = _embedding_span(span_exporter, make_engine(), run_to_completion)
    assert a["embedding.embeddings.0.embedding.text"] == a["input.value"] == PROMPT
    assert list(a["embedding.embeddings.0.embedding.vector"]) == output.pooled
    assert "output.value" not in a


def test_metrics_count_an_embeddings_prompt_and_judge_no_token_latency(
    use_settings, make_engine, run_to_completion
):
    use_settings()
    engine = make_engine()
    labels = {"model_name": engine.model_name, "engine": engine.engine_id}
    duration = {
        "gen_ai_operation_name": "embeddings",
        "gen_ai_provider_name": "spyglass",
        "gen_ai_request_model": engine.model_name,
        "engine": engine.engine_id,
        "error_type": "",
    }

    def value(name, **extra):
        sample = REGISTRY.get_sample_value(name, {**labels, **extra})
        assert sample is not None, f"no series {name} {extra}"
        return sample

    assert REGISTRY.get_sample_value("gen_ai_server_request_duration_seconds_count", duration) == 0
    token_ids = engine.tokenizer.encode(PROMPT)
    engine.add_request("e", token_ids, pooling_request_params(PoolingParams()))
    run_to_completion(engine)
    assert value("spyglass:prompt_tokens_total") == len(token_ids)
    assert value("spyglass:generation_tokens_total") == 0
    assert value("spyglass:request_success_total", finished_reason="stop") == 1
    assert value("spyglass:slo_requests_total") == 0
    assert value("spyglass:time_to_first_token_seconds_count") == 0
    assert REGISTRY.get_sample_value("gen_ai_server_request_duration_seconds_count", duration) == 1


def test_a_classification_span_is_an_evaluator_with_its_verdict_on_opt_in(
    use_settings, span_exporter, tiny_pooling_model_dir, run_to_completion
):
    from spyglass.core.engine.config import EngineConfig
    from spyglass.core.engine.engine import LLMEngine

    path = tiny_pooling_model_dir("LlamaConfig", "LlamaForSequenceClassification", num_labels=3)
    use_settings(trace_content=True)
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", pooling_type="mean"))
    (config,) = [
        sample.labels
        for metric in REGISTRY.collect()
        if metric.name == "spyglass:engine_config_info"
        for sample in metric.samples
        if sample.labels["engine"] == engine.engine_id
    ]
    assert (config["tasks"], config["pooling_type"]) == ("classify+embed", "mean")
    try:
        params = pooling_request_params(PoolingParams(task="classify"))
        engine.add_request("c", engine.tokenizer.encode(PROMPT), params, prompt=PROMPT)
        output = run_to_completion(engine)["c"]
    finally:
        engine.shutdown()
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name.startswith("classify ")]
    a = span.attributes
    assert a["gen_ai.operation.name"] == "classify"
    assert a["openinference.span.kind"] == "EVALUATOR"
    assert a["spyglass.classify.activation"] is True
    assert a["spyglass.classify.num_classes"] == 3
    assert json.loads(a["output.value"]) == output.pooled
    assert a["input.value"] == PROMPT
    assert "embedding.embeddings.0.embedding.text" not in a
