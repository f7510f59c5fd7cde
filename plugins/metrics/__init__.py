"""Prometheus metrics from hook events: scheduler state per step, latencies per request, SLO attainment.

Every metric is defined in `spyglass.telemetry.metrics`; this plugin only records. The entry point
names `MetricsPlugin`, so each engine has its own instance, and that instance its own
`MetricsRecorder` with its own label children: ``model_name`` (the served model name when one is
set) and ``engine`` (the engine's id). Every series whose labels are known at start exists from
the start, at zero, so that panels show 0 and ``rate()`` and ``increase()`` see the first event.
When the engine stops, its series are removed, except ``engine_ready``, which stays at 0.
"""

from spyglass.core.plugin_api import (
    EngineConfig,
    EngineInfo,
    FinishReason,
    PluginContext,
    Request,
    StepStats,
    hookimpl,
)
from spyglass.plugins.metrics.recorder import MetricsRecorder
from spyglass.telemetry import settings as telemetry_settings

__all__ = ["MetricsPlugin", "MetricsRecorder"]


class MetricsPlugin:
    """One engine's metrics: records nothing when the engine's telemetry settings switch metrics off."""

    def __init__(self, context: PluginContext):
        self.settings = telemetry_settings.resolve(context.telemetry)
        self.recorder: MetricsRecorder | None = None

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Start recording for this engine, unless metrics are switched off."""
        self.recorder = (
            MetricsRecorder(info, self.settings, config) if self.settings.metrics else None
        )

    @hookimpl
    def spyglass_engine_stopped(self, info: EngineInfo) -> None:
        """Remove the engine's series (``engine_ready`` stays, at 0)."""
        if self.recorder is not None:
            self.recorder.stopped()
            self.recorder = None

    @hookimpl
    def spyglass_request_added(self, request: Request) -> None:
        """Track the request for its inter-token latencies."""
        if self.recorder is not None:
            self.recorder.request_added(request)

    @hookimpl
    def spyglass_request_first_token(self, request: Request) -> None:
        """TTFT and prompt tokens."""
        if self.recorder is not None:
            self.recorder.first_token(request)

    @hookimpl
    def spyglass_request_preempted(self, request: Request) -> None:
        """Count a preemption."""
        if self.recorder is not None:
            self.recorder.preemptions.inc()

    @hookimpl(trylast=True)
    def spyglass_request_finished(self, request: Request, reason: FinishReason) -> None:
        """Finish reason, per-request latencies and lengths, SLO attainment (after the tracing plugin ran)."""
        if self.recorder is not None:
            self.recorder.request_finished(request, reason)

    @hookimpl
    def spyglass_drafts_verified(
        self, request: Request, num_draft_tokens: int, num_accepted_tokens: int
    ) -> None:
        """Speculative decoding: proposals, draft tokens, accepted tokens and acceptance by position."""
        if self.recorder is not None:
            self.recorder.drafts_verified(num_draft_tokens, num_accepted_tokens)

    @hookimpl
    def spyglass_step_finished(self, stats: StepStats) -> None:
        """Gauges, tokens and step histograms."""
        if self.recorder is not None:
            self.recorder.step_finished(stats)
