"""The ``/metrics`` body: OpenMetrics (with exemplars) when the scraper asks for it, else Prometheus text.

prometheus-client's default OpenMetrics encoder turns the colon of ``spyglass:`` names into an
underscore on sample lines but not on the ``# TYPE`` lines (prometheus/client_python#1177), so
strict parsers see orphaned metadata. Our names are all valid classic Prometheus names, for
which the ``allow-utf-8`` escaping writes them unchanged; we use it and advertise plain
OpenMetrics 1.0.0.

With the ``vllm`` metrics namespace, every ``spyglass:`` name is exported as vLLM's: the prefix
becomes ``vllm:``, the few names that differ are mapped (`VLLM_NAMES`), and the older names that
vLLM dashboards still chart are exported too (`VLLM_ALIASES`). The renaming happens at scrape
time, so the engine records each metric once whatever the namespace.

Constant labels (`TelemetrySettings.metrics_labels`, e.g. ``replica="1"`` on each engine replica
behind a Ray Serve ingress) are added to every sample at scrape time too, so no metric definition
or plugin needs to know about them.
"""

from prometheus_client import REGISTRY
from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from spyglass.telemetry import metrics
from spyglass.telemetry import settings as telemetry_settings

OPENMETRICS = "application/openmetrics-text"
PREFIX = "spyglass:"
# Spyglass names whose vLLM name is not just the prefix swapped.
VLLM_NAMES = {
    # A histogram named like a counter in vLLM; Spyglass's own name drops the ``_total``.
    metrics.ITERATION_TOKENS._name: "vllm:iteration_tokens_total",
}
# Older vLLM names that dashboards still query, exported as copies beside the current ones.
VLLM_ALIASES = {
    "vllm:inter_token_latency_seconds": "vllm:time_per_output_token_seconds",
    "vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc",
}


def vllm_name(name: str) -> str:
    """The name vLLM gives the quantity Spyglass exports as ``name`` (unchanged if it is not Spyglass's)."""
    if name in VLLM_NAMES:
        return VLLM_NAMES[name]
    return "vllm:" + name.removeprefix(PREFIX) if name.startswith(PREFIX) else name


class RenamedRegistry(Collector):
    """A view of ``registry`` whose metric families (and their samples) are renamed by ``rename``."""

    def __init__(self, registry: Collector, rename, aliases: dict[str, str] | None = None):
        self.registry = registry
        self.rename = rename
        self.aliases = aliases or {}

    def collect(self):
        for family in self.registry.collect():
            name = self.rename(family.name)
            yield family if name == family.name else _renamed(family, name)
            if name in self.aliases:
                yield _renamed(family, self.aliases[name])


def _renamed(family: Metric, name: str) -> Metric:
    renamed = Metric(name, family.documentation, family.type, family.unit)
    renamed.samples = [s._replace(name=name + s.name[len(family.name) :]) for s in family.samples]
    return renamed


class LabelledRegistry(Collector):
    """A view of ``registry`` whose every sample also carries ``labels`` (a sample's own labels win)."""

    def __init__(self, registry: Collector, labels: dict[str, str]):
        self.registry = registry
        self.labels = labels

    def collect(self):
        for family in self.registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                s._replace(labels={**self.labels, **s.labels}) for s in family.samples
            ]
            yield labelled


def render_metrics(
    accept: str | None = None, registry: Collector = REGISTRY, namespace: str | None = None
):
    """The scrape body and its content type for a request with this ``Accept`` header.

    ``namespace`` (default: the telemetry settings') ``vllm`` exports vLLM's metric names; the
    settings' ``metrics_labels`` are added to every sample.
    """
    settings = telemetry_settings.current()
    if settings.metrics_labels:
        registry = LabelledRegistry(registry, dict(settings.metrics_labels))
    if (namespace or settings.metrics_namespace) == "vllm":
        registry = RenamedRegistry(registry, vllm_name, VLLM_ALIASES)
    if accept and any(part.split(";")[0].strip() == OPENMETRICS for part in accept.split(",")):
        return openmetrics.generate_latest(
            registry, escaping=openmetrics.ALLOWUTF8
        ), openmetrics.CONTENT_TYPE_LATEST
    return text_format.generate_latest(registry), text_format.CONTENT_TYPE_LATEST


class MergedRegistry(Collector):
    """The engine process's metric families, with the HTTP server's own (`metrics.SERVER_METRICS`).

    Both processes define every Spyglass metric; each family is taken from the process that
    records it.
    """

    def __init__(self, engine_families: list[Metric], registry: Collector = REGISTRY):
        self.engine_families = engine_families
        self.registry = registry

    def collect(self):
        server = {metric._name for metric in metrics.SERVER_METRICS}
        yield from (family for family in self.engine_families if family.name not in server)
        yield from (family for family in self.registry.collect() if family.name in server)
