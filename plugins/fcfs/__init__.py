"""First come, first served: admit in arrival order (preempted requests first), preempt the newest."""

from collections.abc import Iterable, Sequence

from spyglass.core.plugin_api import Request, hookimpl


class FcfsPolicy:
    """The default policy, as vLLM's: the waiting queue in order; the last running request is the victim."""

    name = "fcfs"
    waiting_classes = ("default",)

    def admission_order(
        self, waiting: Sequence[Request], running: Sequence[Request]
    ) -> Iterable[Request]:
        """The waiting queue as it stands (preempted requests were put back at its head)."""
        return waiting

    def choose_victim(self, candidates: Sequence[Request], needy: Request) -> Request | None:
        """The most recently admitted candidate."""
        return candidates[-1]

    def waiting_class(self, request: Request) -> str:
        """All requests share one class."""
        return "default"


@hookimpl
def spyglass_scheduling_policy(name, config):
    """Provide the ``fcfs`` policy."""
    return FcfsPolicy() if name == "fcfs" else None
