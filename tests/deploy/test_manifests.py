"""The Kubernetes manifests and the CPU Dockerfile under deploy/, checked without a cluster or a container runtime.

Built-in kinds are validated strictly against Kubernetes' own OpenAPI schemas (kubernetes-validate),
for the oldest and newest releases it ships. The ServiceMonitor is a Prometheus Operator CRD whose
schema kubernetes-validate does not have: its fields are checked against `SERVICE_MONITOR`, written
here from the CRD's ``monitoring.coreos.com/v1`` definition (the fields these manifests use). Then the
pieces are checked against each other and against the server: selectors match labels, named ports
exist, probe and scrape paths are routes the app serves, the container's arguments parse as
``spyglass serve`` options, and every metric the autoscaler uses is one the server exports.
"""

from pathlib import Path

import jsonschema
import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

from prometheus_client.metrics import MetricWrapperBase  # noqa: E402

from spyglass.core.api.app import create_app  # noqa: E402
from spyglass.core.cli.main import build_parser  # noqa: E402
from spyglass.core.engine.config import EngineConfig  # noqa: E402
from spyglass.telemetry import metrics  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector"],  # the CRD's one required field
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                        },
                    },
                },
            },
        },
    },
}


def _documents() -> list[dict]:
    return [
        doc
        for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _one(kind: str) -> dict:
    (found,) = [doc for doc in _documents() if doc["kind"] == kind]
    return found


def _server_routes() -> set[str]:
    return {route.path for route in create_app(EngineConfig()).routes}


def _exported_metric_names() -> set[str]:
    return {value._name for value in vars(metrics).values() if isinstance(value, MetricWrapperBase)}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_built_in_kinds_match_the_kubernetes_schemas(version):
    built_in = [doc for doc in _documents() if doc["kind"] != "ServiceMonitor"]
    assert {doc["kind"] for doc in built_in} == {
        "Deployment",
        "Service",
        "ConfigMap",
        "HorizontalPodAutoscaler",
    }
    for doc in built_in:
        kubernetes_validate.validate(
            doc, version, strict=True
        )  # raises ValidationError with the path


def test_service_monitor_has_the_crd_fields_and_finds_the_service():
    monitor, service = _one("ServiceMonitor"), _one("Service")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # why it is checked by hand
        kubernetes_validate.validate(monitor, KUBERNETES_VERSIONS[-1], strict=True)
    jsonschema.validate(monitor, SERVICE_MONITOR)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    port_names = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names and endpoint["path"] in _server_routes()


def test_service_and_probes_reach_the_server():
    deployment, service = _one("Deployment"), _one("Service")
    pod = deployment["spec"]["template"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= ports.keys()
    probes = {
        name: container[name]["httpGet"]
        for name in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert (
        probes["readinessProbe"]["path"] == "/ready"
        and probes["livenessProbe"]["path"] == "/health"
    )
    for probe in probes.values():
        assert probe["path"] in _server_routes() and probe["port"] in ports

    args = build_parser(container["args"]).parse_args(container["args"])
    assert args.port == ports["http"] and args.host == "0.0.0.0"
    # The pod gets SIGKILLed after the grace period: it must outlast the server's drain.
    assert pod["spec"]["terminationGracePeriodSeconds"] > args.shutdown_timeout


def test_autoscaler_scales_the_deployment_on_a_metric_the_server_exports():
    hpa, adapter = _one("HorizontalPodAutoscaler"), _one("ConfigMap")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": _one("Deployment")["metadata"]["name"],
    }
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    series = rule["seriesQuery"].split("{")[0].strip("'\"")
    assert series == "spyglass:num_requests_waiting" and series in _exported_metric_names()
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == rule["name"]["as"]


def test_cpu_dockerfile_installs_the_cpu_torch_and_runs_a_valid_serve_command():
    text = (DEPLOY / "Dockerfile.cpu").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and "torch" in line]
    assert installs == [
        "RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
    ]
    assert "cu1" not in text and "nvidia" not in text.lower()
    command = yaml.safe_load(
        next(line for line in text.splitlines() if line.startswith("CMD "))[4:]
    )
    args = build_parser(command).parse_args(command)
    assert (
        args.model_positional
        == _one("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"][1]
    )
