"""Block tables per request on top of the `BlockPool`: what the scheduler asks for KV space."""

from dataclasses import dataclass
from typing import Any

from spyglass.core.engine.kv.block_pool import BlockPool, BlockPoolIntegrityError
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

    With a ``sliding_window`` ``w`` (set when every layer of the model slides, see
    `ModelArchConfig.kv_window`), blocks that no layer can read again go back to the pool as the
    request advances: before each allocation, the blocks wholly before position
    ``num_computed_tokens - w + 1`` (the first position the next step's first row sees) are freed
    and their table entries point at `null_block_id`. Tables keep their positional layout (entry
    ``i`` holds positions ``i * block_size ..``); the null block is one extra cache block past the
    pool's (the runner allocates ``num_cache_blocks``), never allocated or cached, never written,
    so it stays zero and attention's masked reads of it are harmless.
    """

    def __init__(
        self, pool: BlockPool, block_size: int, hooks: Any, sliding_window: int | None = None
    ):
        self.pool = pool
        self.block_size = block_size
        self.hooks = hooks
        self.sliding_window = sliding_window
        self.null_block_id = pool.num_blocks
        self.block_tables: dict[str, list[int]] = {}
        self._num_announced_full: dict[str, int] = {}
        # Per request, how many leading table entries were released (all point at the null block).
        self._num_released: dict[str, int] = {}

    @property
    def num_cache_blocks(self) -> int:
        """Blocks the KV cache tensors need: the pool's, plus the null block when blocks are released."""
        return self.pool.num_blocks + (self.sliding_window is not None)

    def match_prefix(self, request: Request) -> PrefixMatch:
        """Ask plugins for cached blocks covering the start of a request with nothing computed yet.

        Raises (the plugin's error, or ValueError for a malformed match); the scheduler then fails
        the request.
        """
        match: PrefixMatch | None = self.hooks.spyglass_match_prefix(
            request=request, block_pool=self.pool, block_size=self.block_size
        )
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

    def allocate_slots(
        self, request: Request, num_new_tokens: int, prefix: PrefixMatch = NO_MATCH
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed and in-flight ones (and any
        prefix hit).

        Returns False, changing nothing, when the pool cannot supply the blocks: the scheduler
        then preempts someone or waits. Blocks out of the window are released first (even then), so
        they count as free.
        """
        table = self._release_out_of_window(request, self.block_tables.get(request.req_id, []))
        num_total = request.num_launched_tokens + prefix.num_tokens + num_new_tokens
        num_needed = -(-num_total // self.block_size) - len(table) - len(prefix.block_ids)
        if num_needed <= 0 and not prefix.block_ids:
            return True  # most decode steps: the held blocks have room, and the table stays as is
        num_revived = sum(1 for b in prefix.block_ids if self.pool.blocks[b].ref_cnt == 0)
        if num_needed + num_revived > self.pool.num_free_blocks:
            return False
        self.pool.touch(list(prefix.block_ids))
        new_blocks = (
            self.pool.allocate(self._with_extent(num_needed, len(table) + len(prefix.block_ids)))
            or []
        )
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
        if self.sliding_window is not None:
            return num_needed  # an extent would hold blocks far ahead of a window that reads few
        rounded = -(-(num_held + num_needed) // EXTENT_BLOCKS) * EXTENT_BLOCKS - num_held
        if self.pool.num_free_blocks - rounded < self.pool.num_blocks // 2:
            return num_needed
        return rounded

    def free(self, request: Request) -> None:
        """Return all of a request's blocks, tail first so that shared prefixes stay cached longest."""
        table = self.block_tables.pop(request.req_id, [])
        self._num_announced_full.pop(request.req_id, None)
        num_released = self._num_released.pop(request.req_id, 0)
        self.pool.free(table[num_released:][::-1])

    def _release_out_of_window(self, request: Request, table: list[int]) -> list[int]:
        """Free the table's blocks that the next step cannot see (the null block takes their entries);
        the table, a new list when any was freed: a table only ever changes by being replaced, so
        the runner's copy of it (`BlockTableRows`) knows it changed by its identity.

        The next step's first row sits at ``p = num_computed_tokens`` and sees positions ``> p - w``;
        later rows see later ones. Block ``i`` ends at position ``(i + 1) * block_size - 1``, so it
        is dead once ``(i + 1) * block_size <= p - w + 1``. Dead blocks are full and were announced
        (`announce_full_blocks` runs when tokens are computed, before the next allocation), so a
        prefix cache keeps them cached in the free queue like a finished request's.
        """
        if self.sliding_window is None or not table:
            return table
        num_dead = (request.num_computed_tokens - self.sliding_window + 1) // self.block_size
        num_dead = min(num_dead, len(table))
        start = self._num_released.get(request.req_id, 0)
        if num_dead <= start:
            return table
        dead = table[start:num_dead]
        table = table[:start] + [self.null_block_id] * len(dead) + table[num_dead:]
        self.block_tables[request.req_id] = table
        self._num_released[request.req_id] = num_dead
        self.pool.free(dead[::-1])
        return table

    def num_held_blocks(self, req_id: str) -> int:
        """Pool blocks a request holds now (its table's length less the entries released to the null block)."""
        return len(self.block_tables.get(req_id, ())) - self._num_released.get(req_id, 0)

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
        """The blocks of a request, in token order (released ones read as `null_block_id`)."""
        return self.block_tables[req_id]

    def check_integrity(self) -> None:
        """Check the pool against the block tables (see `BlockPool.check_integrity`).

        Also: a table's released entries are exactly its leading ones, and only they name the null block.
        """
        references: dict[int, int] = {}
        for req_id, table in self.block_tables.items():
            num_released = self._num_released.get(req_id, 0)
            null = self.null_block_id
            if table[:num_released] != [null] * num_released or null in table[num_released:]:
                raise BlockPoolIntegrityError(
                    f"request {req_id}: null entries disagree with {num_released} released"
                )
            for block_id in table[num_released:]:
                references[block_id] = references.get(block_id, 0) + 1
        self.pool.check_integrity(references)
