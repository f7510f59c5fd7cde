"""The contract between the scheduler and a scheduling-policy plugin."""

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from spyglass.core.engine.request import Request


@runtime_checkable
class SchedulingPolicy(Protocol):
    """Decides who is admitted next and who is preempted; the scheduler does the bookkeeping.

    Policies see requests read-only and keep any state of their own (per-tenant credit, ...).
    A policy may also name the ``waiting_classes`` it knows before any request arrives (a tuple
    of strings; optional), so their waiting-request series exist, at zero, from the start. And
    it may say that it orders requests by ``SamplingParams.priority`` (``reads_priority = True``;
    optional): the HTTP API then serves OpenAI's ``service_tier`` ``priority`` and ``flex`` as
    priorities, which it refuses where the policy would not read them.
    """

    name: str

    def admission_order(
        self, waiting: Sequence[Request], running: Sequence[Request]
    ) -> Iterable[Request]:
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


@runtime_checkable
class PreemptingPolicy(SchedulingPolicy, Protocol):
    """A policy that may also preempt running work for a waiting request (optional extension).

    The scheduler calls `should_preempt_for` when a waiting request it is admitting does not get
    KV blocks; a policy without the method never preempts for admissions (as FCFS).
    """

    def should_preempt_for(
        self, waiting_request: Request, running: Sequence[Request]
    ) -> Request | None:
        """Which of ``running`` to preempt so that ``waiting_request`` fits, or None to let it wait.

        Asked again after each preemption until the request fits or None comes back, so return a
        victim only while it is worth it (e.g. strictly lower priority), or the batch drains.
        """
        ...


def check_policy(policy: object, requested: str) -> SchedulingPolicy:
    """``policy`` if it fulfils `SchedulingPolicy` (a string ``name`` and the three methods); TypeError otherwise.

    Run when the engine starts, so a broken policy fails the start rather than every request.
    """
    problems = [
        f"no {member}() method"
        for member in ("admission_order", "choose_victim", "waiting_class")
        if not callable(getattr(policy, member, None))
    ]
    if not isinstance(getattr(policy, "name", None), str):
        problems.insert(0, "no str name")
    if isinstance(policy, type):
        problems.insert(0, "a class where an instance is expected")
    if problems:
        raise TypeError(
            f"the plugin providing the scheduling policy {requested!r} returned {policy!r}, which does not fulfil "
            f"the SchedulingPolicy protocol: {'; '.join(problems)}"
        )
    return policy  # type: ignore[return-value]


def tenant_of(request: Request) -> str:
    """The tenant a request belongs to: ``attributes["tenant"]``, else ``attributes["user"]``, else "default".

    The HTTP API fills them from the ``X-Spyglass-Tenant`` header and the body's ``user``.
    """
    return request.attributes.get("tenant") or request.attributes.get("user") or "default"


def parse_tenant_values(text: str | None) -> dict[str, float]:
    """``"gold=4,free=1"`` -> ``{"gold": 4.0, "free": 1.0}``; for per-tenant policy settings."""
    values = {}
    for item in (text or "").split(","):
        if item.strip():
            name, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"expected tenant=value, got {item!r}")
            values[name.strip()] = float(value)
    return values
