"""Classic static batching: a batch admitted together runs until its longest member finishes.

Nothing is admitted while anything runs, so short requests wait for the longest one in their
batch and for every batch before them. The batch is what fits in one step's seats
(``max_num_seqs``), token budget (``max_num_batched_tokens``) and KV blocks. It exists as the
baseline that continuous batching (``fcfs``) is measured against.
"""

from collections.abc import Iterable, Sequence

from spyglass.core.plugin_api import Request, hookimpl


class StaticPolicy:
    """Admit the waiting queue in order, but only into an empty batch; preempt the newest."""

    name = "static"
    waiting_classes = ("default",)

    def admission_order(
        self, waiting: Sequence[Request], running: Sequence[Request]
    ) -> Iterable[Request]:
        """The waiting queue when nothing runs, else nobody."""
        return () if running else waiting

    def choose_victim(self, candidates: Sequence[Request], needy: Request) -> Request | None:
        """The most recently admitted candidate."""
        return candidates[-1]

    def waiting_class(self, request: Request) -> str:
        """All requests share one class."""
        return "default"


@hookimpl
def spyglass_scheduling_policy(name, config):
    """Provide the ``static`` policy."""
    return StaticPolicy() if name == "static" else None
