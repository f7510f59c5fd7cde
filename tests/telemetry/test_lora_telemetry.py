"""LoRA telemetry with real PEFT adapters: the per-adapter metrics (and their removal when the
engine stops, and their vLLM names), the LLM span's adapter attributes, the request log's ``lora``."""

import json

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.telemetry.exposition import render_metrics

ACTIVE = "spyglass:lora_requests_active"
SUCCESS = "spyglass:lora_request_success_total"
TOKENS = "spyglass:lora_generation_tokens_total"
REASONS = ("stop", "length", "abort", "error")


@pytest.fixture
def lora_engine(use_settings, make_engine, tiny_lora_dirs):
    """``lora_engine(**telemetry_settings)``: an engine with both tiny adapters loaded at start."""

    def make(**settings):
        use_settings(**settings)
        return make_engine(enable_lora=True, max_lora_rank=8, lora_modules=tiny_lora_dirs)

    return make


def lora_samples(engine) -> dict[tuple[str, tuple], float]:
    """This engine's LoRA samples: ``(sample name, sorted extra labels) -> value``."""
    own = {"model_name": engine.model_name, "engine": engine.engine_id}
    found = {}
    for family in REGISTRY.collect():
        for s in family.samples:
            if s.name.startswith("spyglass:lora_") and own.items() <= s.labels.items():
                extra = tuple(sorted((k, v) for k, v in s.labels.items() if k not in own))
                found[(s.name, extra)] = s.value
    return found


def value(engine, name: str, **labels) -> float | None:
    labels |= {"model_name": engine.model_name, "engine": engine.engine_id}
    return REGISTRY.get_sample_value(name, labels)


def test_lora_metrics_per_adapter_then_removed_when_the_engine_stops(lora_engine):
    engine = lora_engine()
    a, b = "tiny-lora-a", "tiny-lora-b"
    for name in (a, b):  # at zero from the start (the adapters named in lora_modules)
        assert value(engine, ACTIVE, lora_name=name) == 0
        assert value(engine, TOKENS, lora_name=name) == 0
        for reason in REASONS:
            assert value(engine, SUCCESS, lora_name=name, finished_reason=reason) == 0

    length = SamplingParams(max_tokens=5, ignore_eos=True)
    # The only token it may sample is a stop token: finishes with reason stop, after one token.
    stop = SamplingParams(max_tokens=5, allowed_token_ids=[7], stop_token_ids=[7])
    adapters = {"a-long": a, "a-stop": a, "b-long": b, "base": None}
    for req_id, name in adapters.items():
        params = stop if req_id.endswith("stop") else length
        engine.add_request(req_id, [1, 2, 3, 4], params, lora_name=name)
    engine.add_request("a-abort", [1, 2, 3], length, lora_name=a)
    assert value(engine, ACTIVE, lora_name=a) == 3 and value(engine, ACTIVE, lora_name=b) == 1
    engine.abort("a-abort")
    assert value(engine, ACTIVE, lora_name=a) == 2

    finished = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        for name in (a, b):  # up while live (waiting or running), down as each finishes
            live = [r for r, n in adapters.items() if n == name and r not in finished]
            assert value(engine, ACTIVE, lora_name=name) == len(live), (name, finished.keys())
    num_tokens = {r: len(o.outputs[0].token_ids) for r, o in finished.items()}
    assert num_tokens == {"a-long": 5, "a-stop": 1, "b-long": 5, "base": 5}
    assert finished["a-stop"].outputs[0].finish_reason == "stop"

    assert value(engine, ACTIVE, lora_name=a) == value(engine, ACTIVE, lora_name=b) == 0
    expected_success = {(a, "length"): 1, (a, "stop"): 1, (a, "abort"): 1, (b, "length"): 1}
    for name in (a, b):
        for reason in REASONS:
            got = value(engine, SUCCESS, lora_name=name, finished_reason=reason)
            assert got == expected_success.get((name, reason), 0), (name, reason)
    assert value(engine, TOKENS, lora_name=a) == num_tokens["a-long"] + num_tokens["a-stop"]
    assert value(engine, TOKENS, lora_name=b) == num_tokens["b-long"]
    # The base model's request is in no LoRA series.
    named = {dict(extra).get("lora_name") for _, extra in lora_samples(engine)}
    assert named - {None} == {a, b}

    # An adapter loaded at run time gets its series with its first request.
    engine.add_lora("late", engine.config.lora_modules[b])
    assert value(engine, ACTIVE, lora_name="late") is None
    engine.add_request(
        "late-1", [5, 6], SamplingParams(max_tokens=2, ignore_eos=True), lora_name="late"
    )
    assert value(engine, ACTIVE, lora_name="late") == 1
    while engine.has_unfinished_requests:
        engine.step()
    assert value(engine, ACTIVE, lora_name="late") == 0
    assert value(engine, SUCCESS, lora_name="late", finished_reason="length") == 1
    assert value(engine, TOKENS, lora_name="late") == 2

    engine.shutdown()
    assert lora_samples(engine) == {}


def info_series(engine) -> list[tuple[dict, float]]:
    """This engine's ``lora_requests_info`` children: their extra labels and values."""
    return [
        (dict(extra), v)
        for (name, extra), v in lora_samples(engine).items()
        if name == "spyglass:lora_requests_info"
    ]


def test_the_lora_info_series_names_running_and_waiting_adapters(
    use_settings, make_engine, tiny_lora_dirs
):
    use_settings()
    engine = make_engine(
        enable_lora=True, max_lora_rank=8, max_loras=1, max_num_seqs=4, lora_modules=tiny_lora_dirs
    )
    a, b = "tiny-lora-a", "tiny-lora-b"
    [(labels, first)] = info_series(engine)  # there from the start, with nothing live
    assert labels == {"max_lora": "1", "waiting_lora_adapters": "", "running_lora_adapters": ""}
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("a", [1, 2, 3], params, lora_name=a)
    engine.add_request("b", [1, 2, 4], params, lora_name=b)  # max_loras=1: waits for a
    engine.add_request("base", [1, 2, 5], params)
    engine.step()
    [(labels, stepped)] = info_series(engine)  # one child: the previous labels' is removed
    assert labels["running_lora_adapters"] == a and labels["waiting_lora_adapters"] == b
    assert stepped >= first
    seen = set()
    while engine.has_unfinished_requests:
        engine.step()
        [(labels, _)] = info_series(engine)
        seen.add(labels["running_lora_adapters"])
    assert b in seen
    [(labels, _)] = info_series(engine)
    assert labels["running_lora_adapters"] == labels["waiting_lora_adapters"] == ""
    engine.shutdown()
    assert info_series(engine) == []


def test_vllm_namespace_exports_the_lora_metrics_by_the_prefix_rule(lora_engine, run_to_completion):
    engine = lora_engine(metrics_namespace="vllm")
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine.add_request("v", [1, 2, 3], params, lora_name="tiny-lora-a")
    run_to_completion(engine)
    body = render_metrics("text/plain")[0].decode()
    own = {"model_name": engine.model_name, "engine": engine.engine_id, "lora_name": "tiny-lora-a"}
    samples = {
        (s.name, s.labels.get("finished_reason")): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if own.items() <= s.labels.items()
    }
    assert samples[("vllm:lora_requests_active", None)] == 0
    assert samples[("vllm:lora_generation_tokens_total", None)] == 3
    assert samples[("vllm:lora_request_success_total", "length")] == 1
    assert not any(name.startswith("spyglass:") for name, _ in samples)


def test_llm_span_and_request_log_name_the_adapter(
    lora_engine, span_exporter, log_stream, run_to_completion
):
    engine = lora_engine()
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for req_id, name in (("with-a", "tiny-lora-a"), ("with-b", "tiny-lora-b"), ("base", None)):
        engine.add_request(req_id, [1, 2, 3], params, lora_name=name)
    run_to_completion(engine)

    spans = {
        s.attributes["spyglass.request.id"]: s
        for s in span_exporter.get_finished_spans()
        if s.attributes.get("openinference.span.kind") == "LLM"
    }
    assert spans.keys() == {"with-a", "with-b", "base"}
    model = engine.model_name
    for req_id, name in (("with-a", "tiny-lora-a"), ("with-b", "tiny-lora-b")):
        a = spans[req_id].attributes
        assert a["spyglass.lora.name"] == a["gen_ai.response.model"] == name
        assert a["gen_ai.request.model"] == model  # offline: the client named no model
    base = spans["base"].attributes
    assert "spyglass.lora.name" not in base and base["gen_ai.response.model"] == model

    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    finished = {r["req_id"]: r for r in records if r["event"] == "request finished"}
    assert finished["with-a"]["lora"] == "tiny-lora-a"
    assert finished["with-b"]["lora"] == "tiny-lora-b"
    assert "lora" not in finished["base"]
