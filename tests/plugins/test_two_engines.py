"""Engines in one process are independent: each has its own plugin instances, series, spans, log lines and stop.

Also: a draft engine belongs to its proposer, stops with its target and never shows up as the
target's; and running engines leaves no state in the plugin modules.
"""

import importlib.metadata
import inspect
import io
import json
import logging
import sys
import weakref

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.plugin_manager import ENTRY_POINT_GROUP, create_plugin_manager
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.telemetry import tracing
from spyglass.telemetry.logging import setup_logging
from spyglass.telemetry.settings import TelemetrySettings

TELEMETRY_PLUGINS = ["fcfs", "prefix_cache", "metrics", "tracing", "request_log"]


def greedy(max_tokens: int = 3) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def sample(name: str, engine, model: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(
        name, {"model_name": model, "engine": engine.engine_id, **labels}
    )


def engine_series(engine_id: str) -> list[str]:
    """Every sample in the registry labelled with this engine id."""
    return [
        s.name for m in REGISTRY.collect() for s in m.samples if s.labels.get("engine") == engine_id
    ]


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "spyglass-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    yield exporter
    tracing.set_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
def request_lines():
    """The ``request finished`` log lines written during the test, as dicts."""
    stream, root = io.StringIO(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    setup_logging(logging.INFO, json=True, stream=stream)
    yield lambda: [
        r
        for r in map(json.loads, stream.getvalue().splitlines())
        if r["event"] == "request finished"
    ]
    root.handlers[:], root.level = handlers, level


class StopWatch:
    """Notes that its engine stopped."""

    def __init__(self):
        self.stopped = False

    @hookimpl
    def spyglass_engine_stopped(self, info):
        """Note the stop."""
        self.stopped = True


def test_two_unrelated_engines_keep_their_own_telemetry(make_engine, driver, spans, request_lines):
    a = make_engine(TELEMETRY_PLUGINS, telemetry=TelemetrySettings(served_model_name="alpha"))
    b = make_engine(
        TELEMETRY_PLUGINS, telemetry=TelemetrySettings(served_model_name="beta", metrics=True)
    )
    assert a.engine_id != b.engine_id
    for name in ("metrics", "tracing", "prefix_cache", "request_log"):
        assert a.plugin_manager.get_plugin(name) is not b.plugin_manager.get_plugin(name)
    a_requests = [driver.add(a, list(range(10, 19)), greedy()) for _ in range(2)]
    b_requests = [driver.add(b, list(range(40, 45)), greedy())]
    driver.drain(a)
    driver.drain(b)

    assert sample("spyglass:request_success_total", a, "alpha", finished_reason="length") == 2
    assert sample("spyglass:request_success_total", b, "beta", finished_reason="length") == 1
    assert sample("spyglass:prefix_cache_queries_total", a, "alpha") == 18
    assert sample("spyglass:prefix_cache_queries_total", b, "beta") == 5
    assert sample("spyglass:request_success_total", a, "beta", finished_reason="length") is None

    request_spans = [s for s in spans.get_finished_spans() if "spyglass.engine.id" in s.attributes]
    by_engine = {s.attributes["spyglass.engine.id"]: [] for s in request_spans}
    for span in request_spans:
        by_engine[span.attributes["spyglass.engine.id"]].append(span.name)
    assert by_engine == {
        a.engine_id: ["text_completion alpha"] * 2,
        b.engine_id: ["text_completion beta"],
    }

    lines = {line["req_id"]: line["engine"] for line in request_lines()}
    assert lines == {
        **{r.req_id: a.engine_id for r in a_requests},
        **{r.req_id: b.engine_id for r in b_requests},
    }

    # B stops; A keeps serving, with its metrics, traces and log lines.
    b.shutdown()
    assert (
        sample("spyglass:engine_ready", b, "beta") == 0
        and sample("spyglass:engine_ready", a, "alpha") == 1
    )
    assert engine_series(b.engine_id) == ["spyglass:engine_ready"]
    later = driver.add(a, list(range(60, 66)), greedy())
    driver.drain(a)
    assert sample("spyglass:request_success_total", a, "alpha", finished_reason="length") == 3
    assert (
        request_lines()[-1]["req_id"] == later.req_id
        and request_lines()[-1]["engine"] == a.engine_id
    )
    assert (
        len(
            [
                s
                for s in spans.get_finished_spans()
                if s.attributes.get("spyglass.engine.id") == a.engine_id
            ]
        )
        == 3
    )


def test_a_draft_engine_belongs_to_its_proposer_and_stops_with_its_target(
    make_engine, driver, tiny_llama_dir
):
    options = {"speculative": "draft", "num_speculative_tokens": 2}
    options["plugin_options"] = {"draft_model": str(tiny_llama_dir)}
    plugins = ["fcfs", "prefix_cache", "metrics", "draft_model"]
    target = make_engine(
        plugins, telemetry=TelemetrySettings(served_model_name="target"), **options
    )
    other = make_engine(plugins, telemetry=TelemetrySettings(served_model_name="other"), **options)
    proposer = target.plugin_manager.get_plugin("draft_model")
    draft = proposer.drafter.engine
    assert draft.engine_id == f"{target.engine_id}-draft"
    assert other.plugin_manager.get_plugin("draft_model").drafter.engine is not draft
    assert draft.plugin_manager.get_plugin("prefix_cache") is not target.plugin_manager.get_plugin(
        "prefix_cache"
    )
    assert not draft.context.telemetry.metrics and not draft.context.telemetry.tracing
    watch = StopWatch()
    draft.plugin_manager.register(watch)

    prompts = [list(range(20, 31)), list(range(50, 57))]
    requests = [driver.add(target, p, greedy(6)) for p in prompts]
    driver.drain(target)
    assert sum(r.num_draft_tokens for r in requests) > 0  # the draft engine did propose

    # The target's counters hold the target's requests only; the draft engine exports nothing.
    assert sample("spyglass:prefix_cache_queries_total", target, "target") == sum(map(len, prompts))
    assert sample("spyglass:request_success_total", target, "target", finished_reason="length") == 2
    assert engine_series(draft.engine_id) == []
    assert sample("spyglass:request_success_total", other, "other", finished_reason="length") == 0

    target.shutdown()
    assert watch.stopped and proposer.drafter is None and not draft.has_unfinished_requests
    assert (
        other.plugin_manager.get_plugin("draft_model").drafter is not None
    )  # the other target's draft lives on


def _contents(value):
    """A comparable copy of what a module-level value holds (None for immutable or opaque values)."""
    if isinstance(value, (dict, weakref.WeakKeyDictionary, weakref.WeakValueDictionary)):
        return {k: id(v) for k, v in list(value.items())}
    if isinstance(value, (list, set, weakref.WeakSet)):
        return [id(v) for v in list(value)]
    if inspect.ismodule(value) or inspect.isclass(value):
        return None
    return {k: id(v) for k, v in vars(value).items()} if hasattr(value, "__dict__") else None


def _plugin_module_state() -> dict:
    modules = [
        name for name in sys.modules if name.startswith(("spyglass.plugins.", "spyglass_audit"))
    ]
    return {
        (module, name): (id(value), _contents(value))
        for module in modules
        for name, value in list(vars(sys.modules[module]).items())
        if not name.startswith("__")
    }


def test_running_engines_leaves_no_state_in_plugin_modules(make_engine, driver, tiny_llama_dir, spans, tmp_path,
                                                           monkeypatch):  # fmt: skip
    installed = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    plugins = [*TELEMETRY_PLUGINS, "slo", "draft_model", "self_draft", "structured_output"]
    plugins += ["audit"] if "audit" in installed else []
    monkeypatch.setenv("SPYGLASS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    create_plugin_manager(plugins)  # imports every plugin module
    before = _plugin_module_state()

    options = {"speculative": "draft", "plugin_options": {"draft_model": str(tiny_llama_dir)}}
    engines = [make_engine(plugins, scheduling_policy="slo", **options),
               make_engine(plugins, speculative="self", telemetry=TelemetrySettings(log_content=True))]  # fmt: skip
    for engine in engines:
        driver.add(engine, list(range(30, 40)), greedy(4))
        engine.step()
    during = _plugin_module_state()  # both engines started, requests in flight
    for engine in engines:
        driver.drain(engine)
        engine.shutdown()
    after = _plugin_module_state()

    for state in (during, after):
        changed = {key for key in before.keys() | state.keys() if before.get(key) != state.get(key)}
        assert not changed, f"plugin modules changed: {sorted(changed)}"
