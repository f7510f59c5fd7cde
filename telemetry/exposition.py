"""The ``/metrics`` body: OpenMetrics (with exemplars) when the scraper asks for it, else Prometheus text.

prometheus-client's default OpenMetrics encoder turns the colon of ``spyglass:`` names into an
underscore on sample lines but not on the ``# TYPE`` lines (prometheus/client_python#1177), so
strict parsers see orphaned metadata. Our names are all valid classic Prometheus names, for
which the ``allow-utf-8`` escaping writes them unchanged; we use it and advertise plain
OpenMetrics 1.0.0.

With the ``vllm`` metrics namespace, every ``spyglass:`` name is exported as vLLM's: the prefix
becomes ``vllm:``, and the few names that differ are mapped (`VLLM_NAMES`). The renaming happens
at scrape time, so the engine records each metric once whatever the namespace.
"""

from prometheus_client import REGISTRY
from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from spyglass.telemetry import metrics  # noqa: F401  (registers every definition before the first scrape)
from spyglass.telemetry import settings as telemetry_settings

OPENMETRICS = "application/openmetrics-text"
PREFIX = "spyglass:"
# Spyglass names whose vLLM name is not just the prefix swapped.
VLLM_NAMES = {
    # A histogram named like a counter in vLLM; Spyglass's own name drops the ``_total``.
    metrics.ITERATION_TOKENS._name: "vllm:iteration_tokens_total",
}


def vllm_name(name: str) -> str:
    """The name vLLM gives the quantity Spyglass exports as ``name`` (unchanged if it is not Spyglass's)."""
    if name in VLLM_NAMES:
        return VLLM_NAMES[name]
    return "vllm:" + name.removeprefix(PREFIX) if name.startswith(PREFIX) else name


class RenamedRegistry(Collector):
    """A view of ``registry`` whose metric families (and their samples) are renamed by ``rename``."""

    def __init__(self, registry: Collector, rename):
        self.registry = registry
        self.rename = rename

    def collect(self):
        for family in self.registry.collect():
            name = self.rename(family.name)
            if name == family.name:
                yield family
                continue
            renamed = Metric(name, family.documentation, family.type, family.unit)
            renamed.samples = [s._replace(name=name + s.name[len(family.name) :]) for s in family.samples]
            yield renamed


def render_metrics(accept: str | None = None, registry: Collector = REGISTRY, namespace: str | None = None):
    """The scrape body and its content type for a request with this ``Accept`` header.

    ``namespace`` (default: the telemetry settings') ``vllm`` exports vLLM's metric names.
    """
    if (namespace or telemetry_settings.current().metrics_namespace) == "vllm":
        registry = RenamedRegistry(registry, vllm_name)
    if accept and any(part.split(";")[0].strip() == OPENMETRICS for part in accept.split(",")):
        return openmetrics.generate_latest(registry, escaping=openmetrics.ALLOWUTF8), openmetrics.CONTENT_TYPE_LATEST
    return text_format.generate_latest(registry), text_format.CONTENT_TYPE_LATEST
