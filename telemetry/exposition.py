"""The ``/metrics`` body: OpenMetrics (with exemplars) when the scraper asks for it, else Prometheus text.

prometheus-client's default OpenMetrics encoder turns the colon of ``spyglass:`` names into an
underscore on sample lines but not on the ``# TYPE`` lines (prometheus/client_python#1177), so
strict parsers see orphaned metadata. Our names are all valid classic Prometheus names, for
which the ``allow-utf-8`` escaping writes them unchanged; we use it and advertise plain
OpenMetrics 1.0.0.
"""

from prometheus_client import REGISTRY
from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import CollectorRegistry
from spyglass.telemetry import metrics  # noqa: F401  (registers every definition before the first scrape)

OPENMETRICS = "application/openmetrics-text"


def render_metrics(accept: str | None = None, registry: CollectorRegistry = REGISTRY) -> tuple[bytes, str]:
    """The scrape body and its content type for a request with this ``Accept`` header."""
    if accept and any(part.split(";")[0].strip() == OPENMETRICS for part in accept.split(",")):
        return openmetrics.generate_latest(registry, escaping=openmetrics.ALLOWUTF8), openmetrics.CONTENT_TYPE_LATEST
    return text_format.generate_latest(registry), text_format.CONTENT_TYPE_LATEST
