"""Strict priority: lower ``SamplingParams.priority`` runs first and may preempt higher numbers.

Waiting requests are admitted by (priority, arrival). When a waiting request does not get KV
blocks, the running request with the highest priority number (newest first among equals) is
preempted for it, as long as that number is strictly higher than the waiting one's. Running
requests that need blocks take them from the lowest-priority candidate too.
"""

from collections.abc import Iterable, Sequence

from spyglass.core.plugin_api import Request, hookimpl


def _rank(request: Request) -> tuple[int, float]:
    return (request.sampling_params.priority, request.times.arrival)


class PriorityPolicy:
    """Admit by (priority, arrival); preempt the least important (highest number, newest)."""

    name = "priority"
    reads_priority = True  # the API may map OpenAI's service_tier onto the priority
    waiting_classes = (
        "priority_0",
    )  # the default priority; others appear with their first request

    def admission_order(
        self, waiting: Sequence[Request], running: Sequence[Request]
    ) -> Iterable[Request]:
        """Waiting requests by priority, then arrival."""
        return sorted(waiting, key=_rank)

    def choose_victim(self, candidates: Sequence[Request], needy: Request) -> Request | None:
        """The least important candidate (possibly ``needy`` itself)."""
        return max(candidates, key=_rank)

    def should_preempt_for(
        self, waiting_request: Request, running: Sequence[Request]
    ) -> Request | None:
        """The least important running request, if strictly less important than ``waiting_request``."""
        victim = max(running, key=_rank, default=None)
        if (
            victim is not None
            and victim.sampling_params.priority > waiting_request.sampling_params.priority
        ):
            return victim
        return None

    def waiting_class(self, request: Request) -> str:
        """``priority_<n>``."""
        return f"priority_{request.sampling_params.priority}"


@hookimpl
def spyglass_scheduling_policy(name, config):
    """Provide the ``priority`` policy."""
    return PriorityPolicy() if name == "priority" else None
