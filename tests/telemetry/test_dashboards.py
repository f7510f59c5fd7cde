"""The generated Grafana dashboard: current, schema-valid, its queries parse and find data in a live Prometheus."""

import importlib.util
import json
import os
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.telemetry import metrics
from spyglass.telemetry.exposition import render_metrics

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
# Metrics that only get a sample when their event happens (an HTTP request, a draft accepted at
# some position without speculation configured); their queries must still parse, but may return
# nothing here.
EVENT_ONLY = {
    "spyglass:http_requests",
    "spyglass:http_errors",
    "spyglass:tool_calls",
    "spyglass:replica_routes",  # exported by a --replicas ingress only
    "spyglass:spec_decode_num_accepted_tokens_per_pos",
}
NOT_CHARTED = {  # exported for alerts and ad-hoc queries, not worth a panel of their own
    "spyglass:lora_requests_info",  # for adapter-aware routers (vLLM's series)
    "spyglass:http_request_duration_seconds",
    "spyglass:slo_ttft_target_seconds",
    "spyglass:slo_tpot_target_seconds",
    "spyglass:request_num_preemptions",
    "spyglass:cache_config_info",
    "spyglass:engine_config_info",
    "spyglass:server_config_info",
    "spyglass:engine_ready",
    "spyglass:tensor_parallel_size",
}
GRAFANA_SCHEMA_PACKAGES = ["@grafana/schema@13.2.3", "typescript@7.0.2"]


@pytest.fixture(scope="module")
def generate():
    spec = importlib.util.spec_from_file_location(
        "spyglass_dashboards_generate", DASHBOARDS / "generate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expressions(dashboard: dict) -> list[str]:
    """Every panel query (PromQL)."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def variable_query(dashboard: dict) -> str:
    """The ``model_name`` variable's Grafana query, ``label_values(metric, model_name)``."""
    return next(
        v["query"]["query"] for v in dashboard["templating"]["list"] if v["name"] == "model_name"
    )


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(?:spyglass:[a-z0-9_:]+|gen_ai_server_[a-z0-9_]+)", expr))


def family(sample_name: str) -> str:
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")


def test_committed_dashboard_is_current_and_charts_every_metric(generate):
    assert (DASHBOARDS / "spyglass.json").read_text() == generate.render(), (
        "run python dashboards/generate.py"
    )
    dashboard = json.loads(generate.render())
    charted = {
        family(n)
        for expr in expressions(dashboard) + [variable_query(dashboard)]
        for n in metric_names(expr)
    }
    defined = {v._name for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)}
    defined |= {metrics.DEVICE_UTILIZATION, metrics.DEVICE_MEMORY_USED}
    assert defined - NOT_CHARTED - charted == set()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert any(t.get("exemplar") for p in dashboard["panels"] for t in p.get("targets", []))
    assert all(
        t["datasource"]["uid"] == "${datasource}"
        for p in dashboard["panels"]
        for t in p.get("targets", [])
    )


def test_provisioning_points_at_the_dashboard_and_prometheus():
    datasources = yaml.safe_load(
        (DASHBOARDS / "grafana/provisioning/datasources/datasources.yaml").read_text()
    )
    (prometheus,) = [d for d in datasources["datasources"] if d["type"] == "prometheus"]
    dashboard = json.loads((DASHBOARDS / "spyglass.json").read_text())
    default = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert prometheus["uid"] == default["current"]["value"]
    assert prometheus["jsonData"]["exemplarTraceIdDestinations"][0]["name"] == "trace_id"
    scrape = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    compose = yaml.safe_load((DASHBOARDS / "compose.yaml").read_text())
    assert {"prometheus", "grafana", "phoenix"} <= compose["services"].keys()
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            assert (DASHBOARDS / volume.split(":")[0]).exists(), volume
    provider = yaml.safe_load(
        (DASHBOARDS / "grafana/provisioning/dashboards/dashboards.yaml").read_text()
    )
    mounted = [
        v.split(":")[1]
        for v in compose["services"]["grafana"]["volumes"]
        if v.startswith("./spyglass.json")
    ]
    assert Path(mounted[0]).parent == Path(provider["providers"][0]["options"]["path"])


def test_dashboard_type_checks_against_grafana_schema(generate, tmp_path, require_tool):
    require_tool("npm")
    cache = (
        Path(os.environ.get("SPYGLASS_CACHE_DIR") or Path.home() / ".cache" / "spyglass")
        / "grafana-schema"
    )
    tsc = cache / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(cache),
                "--no-audit",
                "--no-fund",
                *GRAFANA_SCHEMA_PACKAGES,
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )

    def check(dashboard_json: str) -> subprocess.CompletedProcess:
        source = cache / f"check_{os.getpid()}.ts"
        source.write_text(
            f'import type {{ Dashboard }} from "@grafana/schema";\n'
            f"const dashboard: Dashboard = {dashboard_json};\nexport default dashboard;\n"
        )
        try:
            return subprocess.run(
                [
                    str(tsc),
                    "--noEmit",
                    "--strict",
                    "--moduleResolution",
                    "bundler",
                    "--module",
                    "esnext",
                    "--target",
                    "es2020",
                    "--skipLibCheck",
                    str(source),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            source.unlink()

    result = check(generate.render())
    assert result.returncode == 0, result.stdout + result.stderr
    broken = json.loads(generate.render())
    broken["panels"][1]["gridPos"]["w"] = "wide"  # the check must be able to fail
    assert check(json.dumps(broken)).returncode != 0


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self):
        body, content_type = render_metrics(self.headers.get("Accept"))
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus(start_prometheus):
    """A Prometheus scraping this process's registry every second."""
    exporter = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    yield start_prometheus(f"127.0.0.1:{exporter.server_port}")
    exporter.shutdown()


def test_every_query_parses_and_finds_data_in_prometheus(
    generate,
    prometheus,
    use_settings,
    span_exporter,
    make_engine,
    run_to_completion,
    tiny_lora_dirs,
):
    use_settings()
    lora_name = next(iter(tiny_lora_dirs))
    engine = make_engine(  # the third request waits: waiting_by_class gets a sample
        max_num_seqs=2, enable_lora=True, max_lora_rank=8, lora_modules=tiny_lora_dirs
    )
    prometheus.wait_for_scrapes(1)
    for i in range(3):
        engine.add_request(
            f"d{i}",
            [1, 2, 3, 4 + i],
            SamplingParams(max_tokens=4, ignore_eos=True),
            attributes={"operation": "chat" if i else "text_completion"},
            lora_name=lora_name if i == 1 else None,  # the LoRA panels chart a real adapter's run
        )
    run_to_completion(engine)
    start = time.time()
    prometheus.wait_for_scrapes(4)
    time.sleep(2.5)  # two more scrapes after the run, so every rate() has points on both sides

    model = re.escape(engine.model_name)
    dashboard = json.loads(generate.render())
    (variable_metric,) = metric_names(variable_query(dashboard))
    values = prometheus.api("/api/v1/label/model_name/values", **{"match[]": variable_metric})[
        "data"
    ]
    assert engine.model_name in values
    for expr in expressions(dashboard):
        query = expr.replace("$__rate_interval", "1m").replace("$model_name", model)
        parsed = prometheus.api("/api/v1/format_query", query=query)
        assert parsed["status"] == "success", (expr, parsed)
        result = prometheus.api("/api/v1/query", query=query)
        assert result["status"] == "success", (expr, result)
        if not {family(n) for n in metric_names(expr)} & EVENT_ONLY:
            assert result["data"]["result"], f"no data for {expr}"
    tokens = prometheus.api(
        "/api/v1/query",
        query=f'{metrics.LORA_GENERATION_TOKENS._name}_total{{lora_name="{lora_name}"}}',
    )["data"]["result"]
    assert [float(r["value"][1]) for r in tokens] == [4]  # scraped after the adapter's request

    traced = {
        format(s.context.trace_id, "032x")
        for s in span_exporter.get_finished_spans()
        if s.parent is None
    }
    exemplars = prometheus.api(
        "/api/v1/query_exemplars",
        query=f"{metrics.TIME_TO_FIRST_TOKEN._name}_bucket",
        start=start - 120,
        end=time.time() + 10,
    )["data"]
    stored = {e["labels"]["trace_id"] for series in exemplars for e in series["exemplars"]}
    assert stored & traced
