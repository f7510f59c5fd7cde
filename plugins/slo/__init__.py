"""Earliest deadline first on each request's time-to-first-token target.

A request's deadline is its arrival plus its TTFT target: ``SamplingParams.extra["ttft_slo_s"]``
(the API's ``ttft_slo_s`` body field), else its tenant's default from the plugin option
``slo_ttft`` (``--plugin-option slo_ttft=gold=0.2,free=5``) or the environment variable
``SPYGLASS_SLO_TTFT`` in the same form, else the process's ``--slo-ttft`` target. Waiting requests are admitted
earliest deadline first; under KV pressure the candidate with the latest deadline is preempted.
Requests whose first token comes after the deadline (or that fail without one) are counted in
``spyglass:slo_deadline_misses_total``.
"""

import os
import time
import weakref
from collections.abc import Iterable, Sequence

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.request import FinishReason, Request
from spyglass.core.engine.sched.scheduler_policy import parse_tenant_values, tenant_of
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
        self.model_name: str | None = None
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

    def admission_order(self, waiting: Sequence[Request], running: Sequence[Request]) -> Iterable[Request]:
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
            if self.model_name is not None and telemetry_settings.current().metrics:
                m.SLO_DEADLINE_MISSES.labels(self.model_name).inc()


_policies: "weakref.WeakSet[SloPolicy]" = weakref.WeakSet()


@hookimpl
def spyglass_scheduling_policy(name, config):
    """Provide the ``slo`` policy; tenant targets from ``slo_ttft`` / ``SPYGLASS_SLO_TTFT``, default ``--slo-ttft``."""
    if name != "slo":
        return None
    tenants = parse_tenant_values(config.plugin_options.get("slo_ttft") or os.environ.get(TENANT_TTFT_ENV))
    policy = SloPolicy(telemetry_settings.current().slo_ttft_s, tenants)
    _policies.add(policy)
    return policy


@hookimpl
def spyglass_engine_started(info):
    """Name the model on the policies created for the engine that is starting."""
    for policy in list(_policies):
        if policy.model_name is None:
            policy.model_name = info.model_name


@hookimpl
def spyglass_request_first_token(request):
    """Late first token: a deadline miss."""
    for policy in list(_policies):
        policy.judge(request)


@hookimpl
def spyglass_request_finished(request, reason):
    """Failed before any token: a deadline miss."""
    for policy in list(_policies):
        policy.judge(request, reason)
