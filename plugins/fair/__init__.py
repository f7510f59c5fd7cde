"""Weighted fair sharing of the running batch across tenants.

A request's tenant is ``attributes["tenant"]`` or ``attributes["user"]`` (see `tenant_of`).
Each tenant is entitled to seats in proportion to its weight: the next request admitted is the
oldest one of the tenant with the fewest running-plus-already-ordered requests per unit of
weight, so two equal tenants alternate, and a tenant with weight 2 gets twice the seats of one
with weight 1 when both have work. Under KV pressure the newest request of the tenant furthest
above its share is preempted.

Weights come from ``SPYGLASS_FAIR_WEIGHTS`` (``"gold=4,free=1"``; unnamed tenants weigh 1),
read when the engine starts.
"""

import os
from collections import Counter
from collections.abc import Iterable, Sequence

from spyglass.core.hookspecs import hookimpl
from spyglass.core.request import Request
from spyglass.core.scheduler_policy import parse_tenant_values, tenant_of

WEIGHTS_ENV = "SPYGLASS_FAIR_WEIGHTS"


class FairPolicy:
    """Admit in order of per-tenant share over weight; preempt from the most over-served tenant."""

    name = "fair"

    def __init__(self, weights: dict[str, float] | None = None, default_weight: float = 1.0):
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        if any(w <= 0 for w in [default_weight, *self.weights.values()]):
            raise ValueError("fair-share weights must be positive")

    def weight(self, tenant: str) -> float:
        """The tenant's weight."""
        return self.weights.get(tenant, self.default_weight)

    def admission_order(self, waiting: Sequence[Request], running: Sequence[Request]) -> Iterable[Request]:
        """Interleave tenants: the k-th waiting request of tenant t ranks at (running_t + k) / weight_t."""
        load = Counter(tenant_of(r) for r in running)
        keyed = []
        for index, request in enumerate(waiting):
            tenant = tenant_of(request)
            load[tenant] += 1
            keyed.append((load[tenant] / self.weight(tenant), index, request))
        keyed.sort(key=lambda item: item[:2])
        return [request for _, _, request in keyed]

    def choose_victim(self, candidates: Sequence[Request], needy: Request) -> Request | None:
        """The newest candidate of the tenant with the largest running share over weight."""
        load = Counter(tenant_of(r) for r in candidates)
        tenant = max(load, key=lambda t: load[t] / self.weight(t))
        return max((r for r in candidates if tenant_of(r) == tenant), key=lambda r: r.times.arrival)

    def waiting_class(self, request: Request) -> str:
        """The tenant."""
        return tenant_of(request)


@hookimpl
def spyglass_scheduling_policy(name, config):
    """Provide the ``fair`` policy, weighted by ``SPYGLASS_FAIR_WEIGHTS``."""
    if name != "fair":
        return None
    return FairPolicy(parse_tenant_values(os.environ.get(WEIGHTS_ENV)))
