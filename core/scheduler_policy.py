"""The contract between the scheduler and a scheduling-policy plugin."""

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from spyglass.core.request import Request


@runtime_checkable
class SchedulingPolicy(Protocol):
    """Decides who is admitted next and who is preempted; the scheduler does the bookkeeping.

    Policies see requests read-only and keep any state of their own (per-tenant credit, ...).
    """

    name: str

    def admission_order(self, waiting: Sequence[Request], running: Sequence[Request]) -> Iterable[Request]:
        """Waiting requests in the order to try admitting them this step.

        The scheduler admits them in this order until one does not fit (KV blocks, token
        budget or ``max_num_seqs``); requests not yielded are not admitted this step.
        """
        ...

    def choose_victim(self, candidates: Sequence[Request], needy: Request) -> Request | None:
        """Which of ``candidates`` (running, not yet scheduled this step) to preempt so ``needy`` gets blocks.

        ``needy`` is itself among the candidates; returning it means "preempt the one asking".
        Returning None makes ``needy`` skip this step without preempting anyone.
        """
        ...

    def waiting_class(self, request: Request) -> str:
        """A short label grouping waiting requests for metrics (priority level, tenant, ...)."""
        ...
