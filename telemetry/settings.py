"""What telemetry an engine emits: one dataclass, passed to each engine's plugins.

Each engine's plugins get their settings from their `PluginContext` (`EngineConfig.telemetry`).
`configure` and `current` keep the process default, which the CLI sets once from its options
and which an engine whose config leaves ``telemetry`` unset takes when it starts; plugins never
read it.
"""

import re
from dataclasses import dataclass

METRICS_NAMESPACES = ("spyglass", "vllm")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """Switches and targets for metrics, traces and request logs.

    ``tracing`` only produces spans when an exporter is configured (``otlp_traces_endpoint``, the
    standard ``OTEL_EXPORTER_OTLP_*`` variables, or a tracer provider installed by the caller).
    ``trace_content`` and ``log_content`` put prompt and completion text into spans and logs;
    they are off by default because prompts may be private. ``slo_*`` are the per-request
    targets that the SLO attainment counters compare against. ``trace_steps_interval_s`` bounds
    how long one ``engine_steps`` trace groups step spans. ``served_model_name`` (default: the
    engine's model name) is the ``model_name`` label and the model in span names.
    ``metrics_namespace`` is the metric name prefix: ``spyglass``, or ``vllm`` so that
    dashboards and alerts written for vLLM run unchanged. ``metrics_labels`` are ``(name, value)``
    pairs added to every exported sample at scrape time (e.g. ``replica``), so that several
    processes behind one service stay apart in Prometheus whatever their metrics record.
    """

    metrics: bool = True
    tracing: bool = True
    trace_content: bool = False
    trace_steps: bool = False
    otlp_traces_endpoint: str | None = None
    otlp_protocol: str | None = None
    slo_ttft_s: float = 0.5
    slo_tpot_s: float = 0.05
    log_content: bool = False
    trace_steps_interval_s: float = 10.0
    served_model_name: str | None = None
    metrics_namespace: str = "spyglass"
    metrics_labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.otlp_protocol not in (None, "grpc", "http/protobuf"):
            raise ValueError(
                f"otlp_protocol must be grpc or http/protobuf, got {self.otlp_protocol!r}"
            )
        if self.slo_ttft_s <= 0 or self.slo_tpot_s <= 0:
            raise ValueError("SLO targets must be positive")
        if self.trace_steps_interval_s <= 0:
            raise ValueError("trace_steps_interval_s must be positive")
        if self.metrics_namespace not in METRICS_NAMESPACES:
            raise ValueError(
                f"metrics_namespace must be one of {METRICS_NAMESPACES}, got {self.metrics_namespace!r}"
            )
        for name, _ in self.metrics_labels:
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a Prometheus label name")


_current = TelemetrySettings()


def configure(settings: TelemetrySettings) -> None:
    """Make ``settings`` the process's telemetry settings; engines started afterwards use them."""
    global _current
    _current = settings


def current() -> TelemetrySettings:
    """The settings in force (defaults until `configure` is called)."""
    return _current


def resolve(settings: TelemetrySettings | None) -> TelemetrySettings:
    """An engine's settings (`PluginContext.telemetry`), or the process default when it was given none."""
    return settings if settings is not None else _current
