"""Earliest deadline first on each request's time-to-first-token target.

A request's deadline is its arrival plus its TTFT target: ``SamplingParams.extra["ttft_slo_s"]``
(the API's ``ttft_slo_s`` body field), else its tenant's default from the plugin option
``slo_ttft`` (``--plugin-option slo_ttft=gold=0.2,free=5``) or the environment variable
``SPYGLASS_SLO_TTFT`` in the same form, else the engine's ``--slo-ttft`` target (from its
telemetry settings). Waiting requests are admitted earliest deadline first; under KV pressure
the candidate with the latest deadline is preempted.
Requests whose first token comes after the deadline (or that fail without one) are counted in
``spyglass:slo_deadline_misses_total``. The entry point names `SloPlugin`: each engine's instance
makes that engine's policy and judges only its requests.
"""

import os
import time
import weakref
from collections.abc import Iterable, Sequence

from spyglass.core.plugin_api import (
    EngineConfig,
    EngineInfo,
    FinishReason,
    PluginContext,
    Request,
    hookimpl,
    parse_tenant_values,
    tenant_of,
)
from spyglass.telemetry import metrics as m
from spyglass.telemetry import settings as telemetry_settings

TENANT_TTFT_ENV = "SPYGLASS_SLO_TTFT"


class SloPolicy:
    """Admit by deadline (arrival + TTFT target); preempt the latest deadline; count misses."""

    name = "slo"
    waiting_classes = ("on_time", "missed")

    def __init__(self, default_ttft_s: float, tenant_ttft_s: dict[str, float] | None = None):
        self.default_ttft_s = default_ttft_s
        self.tenant_ttft_s = dict(tenant_ttft_s or {})
        self.misses_counter = (
            None  # the engine's slo_deadline_misses child, once it has started with metrics on
        )
        self.num_deadline_misses = 0
        # Requests this policy has seen, so the hooks below judge only this engine's requests.
        self._seen: weakref.WeakSet[Request] = weakref.WeakSet()

    def ttft_target(self, request: Request) -> float:
        """The request's TTFT target in seconds."""
        target = request.sampling_params.extra.get("ttft_slo_s")
        if target is not None:
            return float(target)
        return self.tenant_ttft_s.get(tenant_of(request), self.default_ttft_s)

    def deadline(self, request: Request) -> float:
        """When the first token is due (``time.monotonic()`` clock)."""
        return request.times.arrival + self.ttft_target(request)

    def admission_order(
        self, waiting: Sequence[Request], running: Sequence[Request]
    ) -> Iterable[Request]:
        """Waiting requests, earliest deadline first."""
        self._seen.update(waiting)
        return sorted(waiting, key=self.deadline)

    def choose_victim(self, candidates: Sequence[Request], needy: Request) -> Request | None:
        """The candidate whose deadline is furthest away."""
        return max(candidates, key=self.deadline)

    def waiting_class(self, request: Request) -> str:
        """``missed`` once the deadline has passed, else ``on_time``."""
        return "missed" if time.monotonic() > self.deadline(request) else "on_time"

    def judge(self, request: Request, reason: FinishReason | None = None) -> None:
        """Count a deadline miss: at the first token if late, or at a finish (not an abort) without one."""
        if request not in self._seen:
            return
        times = request.times
        if reason is None:
            missed = times.first_token > self.deadline(request)
        else:
            missed = not times.first_token and reason is not FinishReason.ABORT
        if missed:
            self.num_deadline_misses += 1
            if self.misses_counter is not None:
                self.misses_counter.inc()


class SloPlugin:
    """Provides one engine's ``slo`` policy and judges that engine's requests against it."""

    def __init__(self, context: PluginContext):
        self.settings = telemetry_settings.resolve(context.telemetry)
        self.policy: SloPolicy | None = None
        self.series: m.EngineSeries | None = None

    @hookimpl
    def spyglass_scheduling_policy(self, name: str, config: EngineConfig) -> SloPolicy | None:
        """The ``slo`` policy; tenant targets from ``slo_ttft`` / ``SPYGLASS_SLO_TTFT``, default ``--slo-ttft``."""
        if name != "slo":
            return None
        tenants = parse_tenant_values(
            config.plugin_options.get("slo_ttft") or os.environ.get(TENANT_TTFT_ENV)
        )
        self.policy = SloPolicy(self.settings.slo_ttft_s, tenants)
        return self.policy

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Bind the deadline-miss counter to this engine's labels (when its metrics are on)."""
        if self.policy is not None and self.settings.metrics:
            self.series = m.EngineSeries(
                self.settings.served_model_name or info.model_name, info.engine_id
            )
            self.policy.misses_counter = self.series.labels(m.SLO_DEADLINE_MISSES)

    @hookimpl
    def spyglass_engine_stopped(self, info: EngineInfo) -> None:
        """Drop this engine's counter."""
        if self.series is not None:
            self.series.remove()
            self.series = None
        if self.policy is not None:
            self.policy.misses_counter = None

    @hookimpl
    def spyglass_request_first_token(self, request: Request) -> None:
        """Late first token: a deadline miss."""
        if self.policy is not None:
            self.policy.judge(request)

    @hookimpl
    def spyglass_request_finished(self, request: Request, reason: FinishReason) -> None:
        """Failed before any token: a deadline miss."""
        if self.policy is not None:
            self.policy.judge(request, reason)
