"""Weighted fair sharing of admissions across tenants.

A request's tenant is ``attributes["tenant"]`` or ``attributes["user"]`` (see `tenant_of`).
The policy counts each tenant's admissions; the next request admitted is the oldest one of the
tenant with the fewest admissions per unit of weight, so two equal tenants alternate, and a
tenant with weight 2 is admitted twice as often as one with weight 1 while both have work. A
tenant that goes idle is forgotten and comes back level with the least-served active tenant,
so idle time earns no credit. Under KV pressure the newest request of the tenant with the most
running requests per unit of weight is preempted.

Weights come from ``--plugin-option fair_weights=gold=4,free=1`` (``EngineConfig.plugin_options``),
else from the environment variable ``SPYGLASS_FAIR_WEIGHTS`` in the same form; unnamed tenants
weigh 1.
"""

import os
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence

from spyglass.core.plugin_api import Request, hookimpl, parse_tenant_values, tenant_of

WEIGHTS_ENV = "SPYGLASS_FAIR_WEIGHTS"


class FairPolicy:
    """Admit in order of per-tenant share over weight; preempt from the most over-served tenant."""

    name = "fair"

    def __init__(self, weights: dict[str, float] | None = None, default_weight: float = 1.0):
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        if any(w <= 0 for w in [default_weight, *self.weights.values()]):
            raise ValueError("fair-share weights must be positive")
        self.admitted: dict[
            str, float
        ] = {}  # admissions per active tenant (idle tenants are dropped)
        self._counted: weakref.WeakSet[Request] = weakref.WeakSet()
        self._last_waiting: list[Request] = []

    @property
    def waiting_classes(self) -> tuple[str, ...]:
        """The tenants named in the weights (others appear with their first request)."""
        return tuple(self.weights)

    def weight(self, tenant: str) -> float:
        """The tenant's weight."""
        return self.weights.get(tenant, self.default_weight)

    def admission_order(
        self, waiting: Sequence[Request], running: Sequence[Request]
    ) -> Iterable[Request]:
        """Interleave tenants: the k-th (from 0) waiting request of tenant t ranks at (admitted_t + k) / weight_t."""
        self._count_admissions(running)
        active = {tenant_of(r) for r in waiting} | {tenant_of(r) for r in running}
        for tenant in [t for t in self.admitted if t not in active]:
            del self.admitted[tenant]
        floor = min((n / self.weight(t) for t, n in self.admitted.items()), default=0.0)
        for tenant in active - self.admitted.keys():
            self.admitted[tenant] = floor * self.weight(tenant)
        queued: Counter[str] = Counter()
        keyed = []
        for index, request in enumerate(waiting):
            tenant = tenant_of(request)
            keyed.append(
                ((self.admitted[tenant] + queued[tenant]) / self.weight(tenant), index, request)
            )
            queued[tenant] += 1
        keyed.sort(key=lambda item: item[:2])
        self._last_waiting = list(waiting)
        return [request for _, _, request in keyed]

    def _count_admissions(self, running: Sequence[Request]) -> None:
        """Charge each request to its tenant once, when it has been scheduled for the first time."""
        for request in [*self._last_waiting, *running]:
            if request.times.first_scheduled and request not in self._counted:
                self._counted.add(request)
                tenant = tenant_of(request)
                self.admitted[tenant] = self.admitted.get(tenant, 0.0) + 1

    def choose_victim(self, candidates: Sequence[Request], needy: Request) -> Request | None:
        """The newest candidate of the tenant with the most candidates per unit of weight."""
        load = Counter(tenant_of(r) for r in candidates)
        tenant = max(load, key=lambda t: load[t] / self.weight(t))
        return max((r for r in candidates if tenant_of(r) == tenant), key=lambda r: r.times.arrival)

    def waiting_class(self, request: Request) -> str:
        """The tenant."""
        return tenant_of(request)


@hookimpl
def spyglass_scheduling_policy(name, config):
    """Provide the ``fair`` policy, weighted by the ``fair_weights`` plugin option or ``SPYGLASS_FAIR_WEIGHTS``."""
    if name != "fair":
        return None
    return FairPolicy(
        parse_tenant_values(
            config.plugin_options.get("fair_weights") or os.environ.get(WEIGHTS_ENV)
        )
    )
