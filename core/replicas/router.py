"""`PrefixAffinityRouter`: Ray Serve's request-router interface, choosing the replica by prompt prefix.

Ray's own ``PrefixCacheAffinityRouter`` (``ray.serve.llm``) does the same with a shared prefix-tree
actor, but it ships in the ``ray[llm]`` extra, which pins vLLM; this one keeps its table in the
routing process and reads the block names the ingress put on the `ForwardedRequest`.

Policy, per request:

0. A call about a kept Responses API response (its ``previous_response_id``, or a
   ``/v1/responses/{id}`` path) goes to the live replica whose tag the id names, the only one that
   keeps it, however busy; with that replica gone, the policy below picks one, which answers that
   it keeps no such response.
1. The live replica that was sent the deepest of the request's leading prompt blocks is preferred,
   unless its queue (Serve's cached count of its ongoing requests) is longer than the shortest
   one by more than ``max_load_gap``: a busy replica is worth a recomputed prefix.
2. Otherwise, or with no known prefix: the power of two choices, the shorter queue of two random
   replicas, as Serve's default router does.

Serve then tries the first rank of candidates, and the next rank if they are full
(``max_ongoing_requests``). The blocks of every routed request are recorded for the replica it
went to; a replica that dies is forgotten. ``spyglass:replica_routes_total`` counts the routed
requests by the reason their replica was chosen.
"""

import random

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from spyglass.core.api.kept_ids import safe_tag
from spyglass.core.replicas.forward import ForwardedRequest
from spyglass.core.replicas.prefix import PrefixTable

# Ray pickles this module by value into the ingress: its counter is reached through the metrics
# module (pickled by name), so the ingress's own registry counts the routes.
from spyglass.telemetry import metrics


def _forwarded(pending_request: PendingRequest | None) -> ForwardedRequest | None:
    args = pending_request.args if pending_request is not None else ()
    return args[0] if args and isinstance(args[0], ForwardedRequest) else None


def _blocks(pending_request: PendingRequest | None) -> tuple[int, ...]:
    forwarded = _forwarded(pending_request)
    return forwarded.prefix_blocks if forwarded is not None else ()


def _keeper(pending_request: PendingRequest | None) -> str | None:
    forwarded = _forwarded(pending_request)
    return forwarded.keeper if forwarded is not None else None


class PrefixAffinityRouter(RequestRouter):
    """Send a call about a kept response to its keeper, a request where its prompt's prefix is
    cached; fall back on the shorter of two queues."""

    def initialize_state(self, max_load_gap: int = 4, capacity: int = 1 << 16) -> None:
        """``request_router_kwargs``: the queue-length gap that overrides affinity, and the table's size in blocks."""
        self.max_load_gap = max_load_gap
        self.table = PrefixTable(capacity)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Ranks of candidates: the keeper of the response the call is about alone, else the prefix
        holder first (if any and not overloaded), else two at random."""
        if not candidate_replicas:
            return []
        keeper = _keeper(pending_request)
        for replica in candidate_replicas if keeper else ():
            if safe_tag(replica.replica_id.unique_id) == keeper:
                return [[replica]]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        match = self.table.match(_blocks(pending_request), by_id)
        if match is not None and not self._overloaded(by_id[match.replica], candidate_replicas):
            preferred = by_id[match.replica]
            return [[preferred], [r for r in candidate_replicas if r is not preferred]]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def _overloaded(self, replica: RunningReplica, candidates: list[RunningReplica]) -> bool:
        lengths = {
            r.replica_id: self._replica_queue_len_cache.get(r.replica_id) for r in candidates
        }
        own = lengths[replica.replica_id]
        known = [n for n in lengths.values() if n is not None]
        return own is not None and own - min(known) > self.max_load_gap

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result
    ) -> None:
        """Count why ``replica_id`` was chosen; remember that it now holds the request's prefix blocks."""
        blocks = _blocks(pending_request)
        if _keeper(pending_request) == safe_tag(replica_id.unique_id):
            reason = "kept_response"
        elif self.table.match(blocks, {replica_id.unique_id}) is not None:
            reason = "prefix"
        else:
            reason = "load"
        metrics.REPLICA_ROUTES.labels(reason).inc()
        if blocks:
            self.table.insert(blocks, replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget a dead replica's blocks: its KV cache went with it."""
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id.unique_id)
