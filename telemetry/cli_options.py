"""Telemetry command-line options shared by ``spyglass serve`` and ``spyglass bench``."""

import argparse

from spyglass.telemetry.settings import METRICS_NAMESPACES, TelemetrySettings

TELEMETRY_LEVELS = ("off", "metrics", "full")


def add_telemetry_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--telemetry``, the OTLP options, content and step tracing, and the SLO targets."""
    group = parser.add_argument_group("telemetry")
    group.add_argument(
        "--telemetry",
        choices=TELEMETRY_LEVELS,
        default="full",
        help="off: no metrics or spans; metrics: Prometheus only; full: metrics and traces (default).",
    )
    group.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        help="Where to export spans over OTLP, e.g. http://127.0.0.1:6006/v1/traces (Phoenix) or "
        "http://127.0.0.1:4317 (gRPC). Default: the OTEL_EXPORTER_OTLP_* variables; none set, no spans.",
    )
    group.add_argument(
        "--otlp-protocol",
        choices=("grpc", "http/protobuf"),
        default=None,
        help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else gRPC for port 4317, else http/protobuf).",
    )
    group.add_argument(
        "--trace-content", action="store_true", help="Record prompts and completions in spans."
    )
    group.add_argument(
        "--trace-steps",
        action="store_true",
        help="One span per engine step, linked to its requests.",
    )
    group.add_argument(
        "--trace-steps-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="Step spans of one busy period share an engine_steps trace, cut at this length (default 10).",
    )
    group.add_argument(
        "--metrics-namespace",
        choices=METRICS_NAMESPACES,
        default="spyglass",
        help="Prefix of the Prometheus metric names; vllm makes dashboards written for vLLM run unchanged.",
    )
    group.add_argument(
        "--metrics-label",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="A label added to every exported metric, e.g. replica=2 (repeatable).",
    )
    group.add_argument(
        "--log-content", action="store_true", help="Put prompts and completions in request logs."
    )
    group.add_argument(
        "--slo-ttft", type=float, default=0.5, metavar="SECONDS", help="TTFT target (default 0.5)."
    )
    group.add_argument(
        "--slo-tpot",
        type=float,
        default=0.05,
        metavar="SECONDS",
        help="TPOT target (default 0.05).",
    )


def settings_from_args(args: argparse.Namespace) -> TelemetrySettings:
    """The `TelemetrySettings` the parsed options describe."""
    level = getattr(args, "telemetry", "full")
    return TelemetrySettings(
        metrics=level != "off",
        tracing=level == "full",
        trace_content=getattr(args, "trace_content", False),
        trace_steps=getattr(args, "trace_steps", False),
        otlp_traces_endpoint=getattr(args, "otlp_traces_endpoint", None),
        otlp_protocol=getattr(args, "otlp_protocol", None),
        slo_ttft_s=getattr(args, "slo_ttft", 0.5),
        slo_tpot_s=getattr(args, "slo_tpot", 0.05),
        log_content=getattr(args, "log_content", False),
        trace_steps_interval_s=getattr(args, "trace_steps_interval", 10.0),
        served_model_name=getattr(args, "served_model_name", None),
        metrics_namespace=getattr(args, "metrics_namespace", "spyglass"),
        metrics_labels=tuple(
            label.partition("=")[::2] for label in getattr(args, "metrics_label", [])
        ),
    )
