"""The metrics plugin: values in the default registry after a run, exemplars, hook errors, devices."""

import re
from collections import Counter

import pytest
from prometheus_client import REGISTRY

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.plugin_manager import create_plugin_manager
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.kernels import cpu_isa
from spyglass.telemetry import metrics
from spyglass.telemetry.exposition import render_metrics
from spyglass.telemetry.settings import TelemetrySettings


class Registry:
    """Read samples by metric name and labels; ``delta`` is the change since construction."""

    def __init__(self, model: str, engine: str):
        self.model = model
        self.engine = engine
        self.before = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for m in REGISTRY.collect()
            for s in m.samples
        }

    def value(self, name: str, **labels) -> float:
        labels.setdefault("model_name", self.model)
        labels.setdefault("engine", self.engine)
        return REGISTRY.get_sample_value(name, labels) or 0.0

    def delta(self, name: str, **labels) -> float:
        labels.setdefault("model_name", self.model)
        labels.setdefault("engine", self.engine)
        return self.value(name, **labels) - self.before.get(
            (name, tuple(sorted(labels.items()))), 0.0
        )


@pytest.fixture
def engine_and_registry(use_settings, make_engine):
    def make(settings=None, **engine_options):
        use_settings(**(settings or {}))
        engine = make_engine(**engine_options)
        return engine, Registry(engine.model_name, engine.engine_id)

    return make


def test_series_exist_at_zero_before_the_first_request(engine_and_registry):
    engine, reg = engine_and_registry({"served_model_name": "tiny"}, scheduling_policy="slo")
    reg.model = "tiny"  # --served-model-name is the label
    for reason in ("stop", "length", "abort", "error"):
        assert reg.value("spyglass:request_success_total", finished_reason=reason) == 0
    for scheduling_class in ("on_time", "missed"):
        assert (
            reg.value("spyglass:num_requests_waiting_by_class", scheduling_class=scheduling_class)
            == 0
        )
    assert (
        reg.value(
            "spyglass:plugin_hook_errors_total",
            plugin="request_log",
            hook="spyglass_request_finished",
        )
        == 0
    )
    assert reg.value("spyglass:e2e_request_latency_seconds_count") == 0
    assert reg.value("spyglass:engine_ready") == 1
    info = {
        "block_size": "16",
        "num_gpu_blocks": str(engine.info.num_kv_blocks),
        "cache_dtype": "float32",
    }
    info |= {"max_model_len": str(engine.max_model_len), "max_num_seqs": "128"}
    assert reg.value("spyglass:cache_config_info", **info) == 1
    assert reg.value("spyglass:tensor_parallel_size") == 1
    how = {"device": "cpu", "dtype": "float32", "kernels": cpu_isa.describe()}
    how |= {"quantization": "auto", "async_output": "off", "async_scheduling": "off"}
    how |= {"tasks": "generate+embed", "pooling_type": "last"}
    assert reg.value("spyglass:engine_config_info", **how) == 1
    engine.shutdown()
    assert reg.value("spyglass:engine_ready") == 0  # kept, at 0, for the not-ready alert
    labels = {"model_name": "tiny", "engine": engine.engine_id}
    assert (
        REGISTRY.get_sample_value("spyglass:e2e_request_latency_seconds_count", labels) is None
    )  # the rest: removed


def test_per_call_histograms_count_each_api_call_once(engine_and_registry, run_to_completion):
    engine, reg = engine_and_registry({})
    call = {"api_request_id": "cmpl-9", "n": 3, "num_choices": 3}
    for index, max_tokens in enumerate((2, 5, 3)):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"cmpl-9-{index}", [1, 2, 3], params, attributes=call)
    run_to_completion(engine)
    assert (
        reg.delta("spyglass:request_params_n_count") == 1
        and reg.delta("spyglass:request_params_n_sum") == 3
    )
    assert reg.delta("spyglass:request_max_num_generation_tokens_count") == 1
    assert reg.delta("spyglass:request_max_num_generation_tokens_sum") == 5  # the longest choice
    assert reg.delta("spyglass:request_params_max_tokens_sum") == 2 + 5 + 3
    assert reg.delta("spyglass:request_inference_time_seconds_count") == 3


def test_request_and_step_metrics_after_a_run(engine_and_registry, run_to_completion):
    engine, reg = engine_and_registry(
        {"slo_ttft_s": 1000.0, "slo_tpot_s": 1000.0}, max_num_batched_tokens=8
    )
    prompts = [list(range(10, 22)), list(range(30, 35)), list(range(40, 43))]
    max_tokens = [6, 4, 1]
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        attributes = {"operation": "chat"} if i == 0 else None
        engine.add_request(
            f"r{i}", prompt, SamplingParams(max_tokens=n, ignore_eos=True), attributes=attributes
        )
    run_to_completion(engine)

    assert reg.delta("spyglass:request_success_total", finished_reason="length") == 3
    assert reg.delta("spyglass:prompt_tokens_total") == sum(map(len, prompts))
    assert reg.delta("spyglass:generation_tokens_total") == sum(max_tokens)
    for name in (
        "time_to_first_token",
        "e2e_request_latency",
        "request_queue_time",
        "request_prefill_time",
        "request_decode_time",
    ):
        assert reg.delta(f"spyglass:{name}_seconds_count") == 3, name
    assert (
        reg.delta("spyglass:request_time_per_output_token_seconds_count") == 2
    )  # one-token requests have none
    assert reg.delta("spyglass:inter_token_latency_seconds_count") == sum(n - 1 for n in max_tokens)
    # Each request's gaps add up to its decode time (observed in one step's groups, `observe_n`).
    assert reg.delta("spyglass:inter_token_latency_seconds_sum") == pytest.approx(
        reg.delta("spyglass:request_decode_time_seconds_sum")
    )
    assert reg.delta("spyglass:request_prompt_tokens_sum") == sum(map(len, prompts))
    assert reg.delta("spyglass:request_generation_tokens_sum") == sum(max_tokens)
    computed = sum(len(p) + n - 1 for p, n in zip(prompts, max_tokens))
    assert reg.delta("spyglass:iteration_tokens_sum") == computed
    steps = reg.delta("spyglass:engine_step_duration_seconds_count")
    assert steps >= computed / 8
    assert reg.delta("spyglass:engine_step_batch_size_count") == steps
    assert reg.delta("spyglass:engine_step_phase_duration_seconds_count", phase="model") == steps
    assert (
        reg.value("spyglass:num_requests_running")
        == reg.value("spyglass:num_requests_waiting")
        == 0
    )
    assert reg.value("spyglass:num_requests_waiting_by_class", scheduling_class="default") == 0
    assert reg.value("spyglass:kv_cache_usage_perc") == 0
    assert (
        reg.delta("spyglass:slo_requests_total")
        == reg.delta("spyglass:slo_met_requests_total")
        == 3
    )
    assert reg.value("spyglass:slo_ttft_target_seconds") == 1000.0

    gen_ai = {"gen_ai_provider_name": "spyglass", "gen_ai_request_model": engine.model_name, "model_name": None,
              "engine": engine.engine_id}  # fmt: skip
    chat = {**gen_ai, "gen_ai_operation_name": "chat"}
    chat = {k: v for k, v in chat.items() if v is not None}
    text = {**chat, "gen_ai_operation_name": "text_completion"}
    assert REGISTRY.get_sample_value("gen_ai_server_time_to_first_token_seconds_count", chat) >= 1
    assert REGISTRY.get_sample_value("gen_ai_server_time_per_output_token_seconds_count", text) >= 1
    assert (
        REGISTRY.get_sample_value(
            "gen_ai_server_request_duration_seconds_count", {**text, "error_type": ""}
        )
        >= 2
    )


def test_gauges_mid_run_slo_misses_preemptions_and_aborts(engine_and_registry):
    engine, reg = engine_and_registry(
        {"slo_ttft_s": 1e-9, "slo_tpot_s": 1e-9}, num_kv_blocks=4, block_size=16
    )
    for req_id in ("a", "b"):
        engine.add_request(
            req_id, list(range(1, 21)), SamplingParams(max_tokens=30, ignore_eos=True)
        )
    engine.step()
    assert reg.value("spyglass:num_requests_running") == 2
    assert 0 < reg.value("spyglass:kv_cache_usage_perc") <= 1
    while engine.has_unfinished_requests:
        engine.step()
    assert reg.delta("spyglass:num_preemptions_total") >= 1
    assert reg.delta("spyglass:request_num_preemptions_sum") == reg.delta(
        "spyglass:num_preemptions_total"
    )
    assert reg.delta("spyglass:slo_requests_total") == 2
    assert (
        reg.delta("spyglass:slo_ttft_met_requests_total")
        == reg.delta("spyglass:slo_met_requests_total")
        == 0
    )

    engine.add_request("c", [5, 6, 7], SamplingParams(max_tokens=20))
    engine.step()
    assert (
        reg.value("spyglass:num_requests_running") == 1
        and reg.value("spyglass:kv_cache_usage_perc") > 0
    )
    engine.abort("c")
    assert reg.delta("spyglass:request_success_total", finished_reason="abort") == 1
    # No step follows the abort (the engine is idle): the gauges do not keep reading the last step.
    assert (
        reg.value("spyglass:num_requests_running") == 0
        and reg.value("spyglass:kv_cache_usage_perc") == 0
    )
    assert reg.delta("spyglass:slo_requests_total") == 2  # aborts are not judged


def test_exemplars_link_latency_buckets_to_traces(
    engine_and_registry, span_exporter, run_to_completion
):
    engine, _ = engine_and_registry({})
    engine.add_request("ex", [1, 2, 3, 4], SamplingParams(max_tokens=3, ignore_eos=True))
    run_to_completion(engine)
    (span,) = [
        s for s in span_exporter.get_finished_spans() if s.name.startswith("text_completion")
    ]
    trace_id = format(span.context.trace_id, "032x")
    body, content_type = render_metrics("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert content_type.startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")
    assert not re.search(
        r"^(# \w+ )?spyglass_", text, re.MULTILINE
    )  # client_python#1177 would mangle the colon
    for name in ("time_to_first_token", "e2e_request_latency", "request_time_per_output_token"):
        pattern = rf'^spyglass:{name}_seconds_bucket\{{.*\}} \S+ # \{{trace_id="{trace_id}"\}}'
        assert re.search(pattern, text, re.MULTILINE), name
    plain, plain_type = render_metrics("text/plain")
    assert plain_type.startswith("text/plain") and b"# {trace_id" not in plain


class FailingPlugin:
    @hookimpl
    def spyglass_step_finished(self, stats):
        raise RuntimeError("boom")


def test_plugin_hook_errors_are_counted(use_settings, tiny_llama_dir, run_to_completion):
    from spyglass.core.engine.config import EngineConfig
    from spyglass.core.engine.engine import LLMEngine

    use_settings()
    pm = create_plugin_manager()
    pm.register(FailingPlugin(), name="failing")
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32"), plugin_manager=pm)
    reg = Registry(engine.model_name, engine.engine_id)
    engine.add_request("e", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    run_to_completion(engine)
    errors = reg.delta(
        "spyglass:plugin_hook_errors_total", plugin="failing", hook="spyglass_step_finished"
    )
    engine.shutdown()
    assert errors == engine.hooks.num_errors["failing.spyglass_step_finished"] == 3


def test_device_utilisation_and_metrics_off(engine_and_registry, run_to_completion):
    sum(range(3_000_000))  # some CPU time between two readings
    utilisation = REGISTRY.get_sample_value(metrics.DEVICE_UTILIZATION, {"device": "cpu"})
    assert utilisation is not None and 0 < utilisation <= 1
    assert REGISTRY.get_sample_value(metrics.DEVICE_MEMORY_USED, {"device": "cpu"}) > 0

    engine, reg = engine_and_registry({"metrics": False})
    engine.add_request("off", [1, 2, 3], SamplingParams(max_tokens=2))
    run_to_completion(engine)
    assert reg.delta("spyglass:request_success_total", finished_reason="length") == 0


def test_constant_labels_are_added_to_every_sample_at_scrape_time(use_settings):
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    Counter("spyglass:things", "Things.", ["model_name"], registry=registry).labels("m").inc(3)
    Histogram("spyglass:waits_seconds", "Waits.", registry=registry, buckets=(1.0,)).observe(0.5)
    use_settings(metrics_labels=(("replica", "1"),), metrics_namespace="vllm")
    body, _ = render_metrics("text/plain", registry=registry)
    samples = [
        s for family in text_string_to_metric_families(body.decode()) for s in family.samples
    ]
    assert samples and all(s.labels.get("replica") == "1" for s in samples)
    assert any(
        s.name == "vllm:things_total" and s.labels == {"replica": "1", "model_name": "m"}
        for s in samples
    )
    openmetrics, _ = render_metrics("application/openmetrics-text", registry=registry)
    assert 'vllm:waits_seconds_bucket{le="1.0",replica="1"} 1.0' in openmetrics.decode()
    with pytest.raises(ValueError, match="label name"):
        TelemetrySettings(metrics_labels=(("bad-name", "x"),))


def test_a_dropped_llm_takes_its_series_with_it(use_settings, tiny_llama_dir):
    # An LLM that goes out of scope shuts its engine down: its series go (engine_ready stays,
    # at 0), and a later explicit shutdown does nothing.
    import gc

    from spyglass.core.llm import LLM

    use_settings()
    llm = LLM(model=str(tiny_llama_dir), device="cpu", kv_cache_memory="16MiB")
    engine = llm.engine
    llm.generate("hi", SamplingParams(max_tokens=2))
    labels = {"model_name": engine.model_name, "engine": engine.engine_id}
    assert REGISTRY.get_sample_value("spyglass:num_requests_running", labels) == 0.0
    del llm
    gc.collect()
    assert REGISTRY.get_sample_value("spyglass:num_requests_running", labels) is None
    assert REGISTRY.get_sample_value("spyglass:engine_ready", labels) == 0.0
    engine.shutdown()
    assert REGISTRY.get_sample_value("spyglass:engine_ready", labels) == 0.0


def test_steps_are_counted_by_how_their_forward_ran(
    engine_and_registry, run_to_completion, eager_graphs
):
    """Eager steps and each kind of graph replay are counted, with the graphs' rows and padding."""
    engine, reg = engine_and_registry(
        speculative="ngram", num_speculative_tokens=3, max_num_batched_tokens=40, max_num_seqs=8
    )
    graphs = eager_graphs(engine, rows_per_request=(1, 4), token_buckets=(32,))
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    # A long prompt's first chunk (40 tokens) runs eagerly; the later prompts' chunks meet the
    # decodes (packed); repeated text gives n-gram drafts (padded verify steps).
    prompts = [list(range(10, 20)) * 6, list(range(30, 36)) * 3, list(range(40, 44)) * 2]
    engine.add_request("long", prompts[0], greedy)
    engine.step()
    for index, prompt in enumerate(prompts[1:]):
        engine.add_request(f"short-{index}", prompt, greedy)
        engine.step()
    run_to_completion(engine)
    forwards = {
        f: reg.delta("spyglass:engine_step_forwards_total", forward=f)
        for f in ("eager", "graph_decode", "graph_padded", "graph_packed")
    }
    replayed = Counter(f"graph_{shape.kind}" for shape in graphs.replayed)
    assert all(forwards.values()), forwards
    assert forwards == {"eager": forwards["eager"], **replayed}
    assert sum(forwards.values()) == reg.delta("spyglass:engine_step_duration_seconds_count")
    rows = sum(shape.tokens for shape in graphs.replayed)
    assert reg.delta("spyglass:cuda_graph_tokens_total") == rows
    padding = rows - sum(graphs.step_tokens)
    assert 0 < padding == reg.delta("spyglass:cuda_graph_padding_tokens_total")


def test_steps_scheduled_ahead_are_counted(engine_and_registry, run_to_completion):
    """Async scheduling's steps launched behind the one in flight, with penalties or bad words;
    none when stepping in turn."""
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    penalised = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=1)
    bad_words = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, bad_words=["the"])
    runs = {
        "ahead": ({"async_output": True, "async_scheduling": True}, [greedy, penalised]),
        "bad words": ({"async_output": True, "async_scheduling": True}, [greedy, bad_words]),
        "in turn": ({}, [greedy, penalised]),
    }
    counted = {}
    for name, (options, params) in runs.items():
        engine, reg = engine_and_registry(**options)
        for index, p in enumerate(params):
            engine.add_request(f"{name}-{index}", list(range(10, 20)), p)
        run_to_completion(engine)
        steps = reg.delta("spyglass:engine_step_duration_seconds_count")
        counted[name] = reg.delta("spyglass:engine_steps_scheduled_ahead_total"), steps
    for ahead, steps in (counted["ahead"], counted["bad words"]):
        assert steps // 2 < ahead < steps  # all but the first steps and the drain
    assert counted["in turn"][0] == 0
