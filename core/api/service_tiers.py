"""OpenAI's ``service_tier`` as a queue priority: ``priority`` runs ahead of the default tier and
``flex`` after it, on a server whose scheduling policy orders requests by priority (``--policy
priority``, whose lower numbers run first and may preempt higher ones). Elsewhere, or beside
vLLM's own ``priority`` field, those tiers are a 400 naming ``service_tier``: a 200 would pretend.
``auto`` and ``default`` are the default tier everywhere.
"""

import msgspec

from spyglass.core.api.errors import APIError

TIER_PRIORITIES = {"priority": -1, "flex": 1}
"""The queue priority of each tier other than the default's (0)."""


def tier_priority(service_tier: str | None, priority: int, orders_by_priority: bool) -> int:
    """The priority a call runs at: its tier's, else its own ``priority`` (vLLM's field)."""
    if service_tier not in TIER_PRIORITIES:
        return priority
    if not orders_by_priority:
        raise APIError(
            400,
            f"service_tier {service_tier!r} needs a server whose scheduling policy orders "
            "requests by priority (spyglass serve --policy priority); this one does not",
            "service_tier",
            "unsupported_parameter",
        )
    if priority:
        raise APIError(400, "give service_tier or priority, not both", "service_tier")
    return TIER_PRIORITIES[service_tier]


def tier_served(service_tier: str | None):
    """The tier a response says it was served in (UNSET where the call named none)."""
    if service_tier is None:
        return msgspec.UNSET
    return service_tier if service_tier in TIER_PRIORITIES else "default"
