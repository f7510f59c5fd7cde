"""Continuous batching under a token budget: which requests run this step, and how many tokens each."""

import logging
from collections.abc import Callable
from dataclasses import dataclass

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.kv.kv_cache_manager import NO_MATCH, KVCacheManager
from spyglass.core.engine.request import FinishReason, Request, RequestStatus
from spyglass.core.engine.sched.image_chunks import chunk_within_images
from spyglass.core.engine.sched.scheduler_policy import SchedulingPolicy

log = logging.getLogger("spyglass.scheduler")


@dataclass(slots=True)
class ScheduledRequest:
    """A request and the number of tokens it computes this step (the last ``num_spec_tokens`` are drafts).

    Not frozen, though nothing changes one: a frozen dataclass sets each field through
    ``object.__setattr__``, three times the cost of a plain one, and the scheduler makes one per
    running request per step."""

    request: Request
    num_new_tokens: int
    num_spec_tokens: int = 0


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """One step's plan: the scheduled requests in batch order, the admitted and the preempted."""

    step_id: int
    scheduled: tuple[ScheduledRequest, ...]
    admitted: tuple[Request, ...]
    resumed: tuple[Request, ...]
    preempted: tuple[Request, ...]
    # Requests a policy or prefix-cache decision failed on, with the error; already out of the queues.
    failed: tuple[tuple[Request, str], ...] = ()
    # Prompt chunks stopped before an image they could not finish (`image_chunks`).
    num_image_waits: int = 0

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens the model computes this step."""
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to run."""
        return not self.scheduled


class Scheduler:
    """Owns the waiting and running queues.

    Running requests are served first, in order; each gets all its outstanding tokens up to
    the budget (a long prompt is thus chunked across steps and mixed with decodes). When KV
    blocks run out the policy picks a victim, which loses its blocks and is recomputed later.
    With async scheduling a step is planned while the previous one runs: a running request starts
    after its in-flight tokens (`Request.num_launched_tokens`), and one that those tokens end (its
    ``max_tokens`` reached) sits the step out. Finishes by EOS or stop string are only known at
    the commit; such a request's extra row is computed and dropped.
    Waiting requests are admitted in the policy's order while blocks, budget and seats last; a
    `PreemptingPolicy` may preempt running work for a waiting request that does not fit.
    A policy or prefix-cache plugin that raises fails the request it was deciding about (listed
    in ``SchedulerOutput.failed``), never the engine; every such failure is counted through
    ``count_error(plugin, hook)``. With ``whole_images`` (a model whose image tokens see their
    whole image) a prompt chunk stops before a run of image tokens it cannot finish
    (`image_chunks`). An admission order that names requests not waiting, or an
    empty one while nothing runs (which would wait for ever), is replaced by FCFS for that step.
    """

    def __init__(
        self,
        config: EngineConfig,
        kv: KVCacheManager,
        policy: SchedulingPolicy,
        count_error: Callable[[str, str], None] = lambda plugin, hook: None,
        whole_images: bool = False,
    ):
        self.config = config
        self.whole_images = whole_images
        self.kv = kv
        self.policy = policy
        self.count_error = count_error
        self._warned_order = False
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._step_id = 0
        self._failed: list[tuple[Request, str]] = []
        self._image_waits = 0

    def add(self, request: Request) -> None:
        """Queue a new request."""
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Plan the next step."""
        self._step_id += 1
        self._failed = []
        self._image_waits = 0
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        for request in list(self.running):
            if request.status != RequestStatus.RUNNING or budget == 0 or _ends_in_flight(request):
                continue
            launched = request.num_launched_tokens  # read once: every step reads every request's
            num_new = min(request.num_tokens_with_spec - launched, budget)
            if self.whole_images:
                num_new = self._within_images(request, launched, num_new)
                if num_new == 0:
                    continue
            if self._make_room(request, num_new, scheduled, preempted):
                num_spec = max(
                    0, launched + num_new - request.num_tokens - request.num_pending_tokens
                )
                scheduled.append(ScheduledRequest(request, num_new, num_spec))
                budget -= num_new
        admitted: list[Request] = []
        resumed: list[Request] = []
        if not preempted:
            self._admit_waiting(scheduled, admitted, resumed, preempted)
        return SchedulerOutput(
            self._step_id,
            tuple(scheduled),
            tuple(admitted),
            tuple(resumed),
            tuple(preempted),
            tuple(self._failed),
            self._image_waits,
        )

    def _admit_waiting(
        self, scheduled: list[ScheduledRequest], admitted: list, resumed: list, preempted: list
    ) -> None:
        """Admit waiting requests in the policy's order while budget, seats and blocks last."""
        try:
            order = list(self.policy.admission_order(self.waiting, self.running))
        except Exception as error:
            # Without an order nobody waiting can be admitted; fail them rather than spin forever.
            message = self._policy_error("admission_order", error)
            for request in list(self.waiting):
                self._fail(request, message)
            return
        order = self._checked_order(order)
        newcomers: list[Request] = []
        # Only a limit on adapters reads them (every step would otherwise walk the running list).
        adapters = (
            set()
            if self.config.max_loras is None
            else {r.lora_name for r in self.running if r.lora_name is not None}
        )
        for request in order:
            budget = self.config.max_num_batched_tokens - sum(s.num_new_tokens for s in scheduled)
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if request not in self.waiting or self._over_lora_limit(request, adapters):
                continue
            num_new = self._admit(request, budget)
            while num_new == 0 and request in self.waiting:
                if not self._preempt_for(request, scheduled, preempted, newcomers):
                    break
                budget = self.config.max_num_batched_tokens - sum(
                    s.num_new_tokens for s in scheduled
                )
                num_new = self._admit(request, budget)
            if num_new == 0:
                if request in self.waiting:
                    break
                continue  # a decision about it failed; try the next
            scheduled.append(ScheduledRequest(request, num_new))
            (resumed if request.num_preemptions else admitted).append(request)
            newcomers.append(request)
            if request.lora_name is not None:
                adapters.add(request.lora_name)

    def _over_lora_limit(self, request: Request, adapters: set[str]) -> bool:
        """Whether admitting ``request`` would run more distinct LoRA adapters than
        ``config.max_loras`` (those in ``adapters`` run already); such a request waits its turn
        while others are admitted."""
        limit = self.config.max_loras
        return (
            limit is not None
            and request.lora_name is not None
            and request.lora_name not in adapters
            and len(adapters) >= limit
        )

    def _checked_order(self, order: list) -> list[Request]:
        """The policy's order, or FCFS when it names strangers or leaves everyone waiting with nothing running."""
        waiting_ids = {id(r) for r in self.waiting}
        invalid = any(id(r) not in waiting_ids for r in order) or len({id(r) for r in order}) < len(
            order
        )
        stalled = not order and self.waiting and not self.running
        if not (invalid or stalled):
            return order
        self.count_error(self.policy_name, "admission_order")
        problem = (
            "named requests that are not waiting" if invalid else "was empty while nothing runs"
        )
        (log.debug if self._warned_order else log.warning)(
            "scheduling policy %r: admission_order %s; admitting in arrival order this step",
            self.policy_name,
            problem,
        )
        self._warned_order = True
        return list(self.waiting)

    @property
    def policy_name(self) -> str:
        """The policy's name, for messages and error counts."""
        return str(getattr(self.policy, "name", type(self.policy).__name__))

    def _make_room(
        self, request: Request, num_new: int, scheduled, preempted: list[Request]
    ) -> bool:
        """Allocate for a running request, preempting victims until it fits; False if it was preempted itself."""
        while not self.kv.allocate_slots(request, num_new):
            taken = {s.request.req_id for s in scheduled}
            candidates = [r for r in self.running if r.req_id not in taken]
            try:
                victim = self.policy.choose_victim(candidates, request)
                if victim is not None and victim not in candidates:
                    raise ValueError(f"returned {victim!r}, which is not one of the candidates")
            except Exception as error:
                self._fail(request, self._policy_error("choose_victim", error))
                return False
            if victim is None:
                return False
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt_for(
        self, request: Request, scheduled: list, preempted: list, just_admitted: list
    ) -> bool:
        """Ask a `PreemptingPolicy` for a running victim to make room for a waiting request; True if one went.

        Requests admitted this very step are not offered: they have not run yet.
        """
        should_preempt_for = getattr(self.policy, "should_preempt_for", None)
        if should_preempt_for is None:
            return False
        try:
            candidates = [r for r in self.running if r not in just_admitted]
            victim = should_preempt_for(request, candidates)
            if victim is not None and victim not in candidates:
                raise ValueError(f"returned {victim!r}, which is not running")
        except Exception as error:
            self._fail(request, self._policy_error("should_preempt_for", error))
            return False
        if victim is None:
            return False
        scheduled[:] = [s for s in scheduled if s.request is not victim]
        self._preempt(victim)
        preempted.append(victim)
        return True

    def _admit(self, request: Request, budget: int) -> int:
        """Give a waiting request blocks (reusing a cached prefix) and move it to running; 0 if it does not fit."""
        prefix = NO_MATCH
        # Prompt logprobs and mean or first-token pooling read every prompt position's own
        # output: nothing is taken from the cache.
        if request.num_computed_tokens == 0 and not request.reads_every_prompt_row:
            try:
                prefix = self.kv.match_prefix(request)
            except Exception as error:
                self.count_error("prefix_cache", "spyglass_match_prefix")
                self._fail(
                    request,
                    f"the prefix cache lookup (spyglass_match_prefix) failed: {_describe(error)}",
                )
                return 0
        num_cached = prefix.num_tokens
        num_new = min(request.num_tokens - request.num_computed_tokens - num_cached, budget)
        if self.whole_images:
            start = request.num_computed_tokens + num_cached
            num_new = self._within_images(request, start, num_new)
        if num_new == 0 or not self.kv.allocate_slots(request, num_new, prefix):
            return 0
        if request.num_preemptions == 0:
            request.num_cached_tokens = num_cached
        request.num_computed_tokens += num_cached
        self.waiting.remove(request)
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        return num_new

    def _within_images(self, request: Request, start: int, num_new: int) -> int:
        """`chunk_within_images`, counting the chunks it stops short."""
        kept = chunk_within_images(request, start, num_new)
        self._image_waits += kept < num_new
        return kept

    def _policy_error(self, method: str, error: Exception) -> str:
        self.count_error(self.policy_name, method)
        return f"scheduling policy {self.policy_name!r} failed in {method}: {_describe(error)}"

    def _fail(self, request: Request, message: str) -> None:
        """Take a request a decision failed on out of the queues; the engine finishes it with an error."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        self._failed.append((request, message))

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.insert(0, request)

    def waiting_by_class(self) -> tuple[tuple[str, int], ...]:
        """Waiting requests counted by the policy's class, sorted by class. The class is only a
        metrics label: a policy that raises is counted as a hook error, its request as "unknown"."""
        classes: dict[str, int] = {}
        for request in self.waiting:
            try:
                label = self.policy.waiting_class(request)
            except Exception:
                self.count_error(self.policy_name, "waiting_class")
                label = "unknown"
            classes[label] = classes.get(label, 0) + 1
        return tuple(sorted(classes.items()))

    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request wherever it is and return its blocks."""
        if request.is_finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason


def _ends_in_flight(request: Request) -> bool:
    """Whether a launched step's pending tokens take the request to its ``max_tokens``: it ends when
    they are committed, and must not be scheduled past them."""
    return (
        request.num_pending_tokens > 0
        and request.num_output_tokens + request.num_pending_tokens >= request.max_tokens
    )


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
