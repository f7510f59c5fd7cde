"""Block tables per request on top of the `BlockPool`: what the scheduler asks for KV space."""

from dataclasses import dataclass
from typing import Any

from spyglass.core.engine.kv.block_pool import BlockPool
from spyglass.core.engine.request import Request


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Cached full blocks that hold a request's first ``num_tokens`` tokens (``block_ids`` in order)."""

    block_ids: tuple[int, ...]
    num_tokens: int


NO_MATCH = PrefixMatch((), 0)

# While the pool is roomy, block tables grow by this many blocks at a time (see `_with_extent`).
EXTENT_BLOCKS = 16


class KVCacheManager:
    """Grants and frees KV blocks for requests; the scheduler never touches the pool directly.

    ``hooks`` is the plugin manager's hook relay: the prefix lookup (`spyglass_match_prefix`)
    and the full-block announcement (`spyglass_blocks_full`) go through it, so prefix caching
    is a plugin.
    """

    def __init__(self, pool: BlockPool, block_size: int, hooks: Any):
        self.pool = pool
        self.block_size = block_size
        self.hooks = hooks
        self.block_tables: dict[str, list[int]] = {}
        self._num_announced_full: dict[str, int] = {}

    def match_prefix(self, request: Request) -> PrefixMatch:
        """Ask plugins for cached blocks covering the start of a request with nothing computed yet.

        Raises (the plugin's error, or ValueError for a malformed match); the scheduler then fails
        the request.
        """
        match: PrefixMatch | None = self.hooks.spyglass_match_prefix(request=request, block_pool=self.pool, block_size=self.block_size)
        if match is None:
            return NO_MATCH
        if match.num_tokens != len(match.block_ids) * self.block_size or not all(
            0 <= b < self.pool.num_blocks for b in match.block_ids
        ):
            raise ValueError(f"invalid PrefixMatch from a plugin: {match}")
        # The last prompt token is always computed, so the step has logits to sample from.
        max_blocks = (request.num_tokens - 1) // self.block_size
        if len(match.block_ids) > max_blocks:
            match = PrefixMatch(match.block_ids[:max_blocks], max_blocks * self.block_size)
        return match

    def allocate_slots(self, request: Request, num_new_tokens: int, prefix: PrefixMatch = NO_MATCH) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed ones (and any prefix hit).

        Returns False, changing nothing, when the pool cannot supply the blocks: the scheduler
        then preempts someone or waits.
        """
        table = self.block_tables.get(request.req_id, [])
        num_total = request.num_computed_tokens + prefix.num_tokens + num_new_tokens
        num_needed = -(-num_total // self.block_size) - len(table) - len(prefix.block_ids)
        num_revived = sum(1 for b in prefix.block_ids if self.pool.blocks[b].ref_cnt == 0)
        if num_needed + num_revived > self.pool.num_free_blocks:
            return False
        self.pool.touch(list(prefix.block_ids))
        new_blocks = self.pool.allocate(self._with_extent(num_needed, len(table) + len(prefix.block_ids))) or []
        self.block_tables[request.req_id] = table + list(prefix.block_ids) + new_blocks
        return True

    def _with_extent(self, num_needed: int, num_held: int) -> int:
        """``num_needed``, rounded up so the table grows in extents of `EXTENT_BLOCKS` while the pool is roomy.

        Blocks taken together are usually neighbours in the cache, so a request's context is read
        in longer contiguous runs (attention on the CPU streams them). The extra blocks are
        ordinary table entries, returned with the request; when under half the pool is free,
        requests take exactly what they need.
        """
        if num_needed <= 0:
            return 0
        rounded = -(-(num_held + num_needed) // EXTENT_BLOCKS) * EXTENT_BLOCKS - num_held
        if self.pool.num_free_blocks - rounded < self.pool.num_blocks // 2:
            return num_needed
        return rounded

    def free(self, request: Request) -> None:
        """Return all of a request's blocks, tail first so that shared prefixes stay cached longest."""
        table = self.block_tables.pop(request.req_id, [])
        self._num_announced_full.pop(request.req_id, None)
        self.pool.free(table[::-1])

    def announce_full_blocks(self, request: Request) -> None:
        """Tell plugins about blocks that became full of computed tokens since the last call."""
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        num_announced = self._num_announced_full.get(request.req_id, 0)
        if num_full > num_announced:
            table = self.block_tables[request.req_id]
            self.hooks.spyglass_blocks_full(
                request=request,
                block_ids=table[:num_full],
                num_new=num_full - num_announced,
                block_pool=self.pool,
                block_size=self.block_size,
            )
            self._num_announced_full[request.req_id] = num_full

    def block_table(self, req_id: str) -> list[int]:
        """The blocks of a request, in token order."""
        return self.block_tables[req_id]

    def check_integrity(self) -> None:
        """Check the pool against the block tables (see `BlockPool.check_integrity`)."""
        references: dict[int, int] = {}
        for table in self.block_tables.values():
            for block_id in table:
                references[block_id] = references.get(block_id, 0) + 1
        self.pool.check_integrity(references)
