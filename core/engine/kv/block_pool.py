"""The pool of fixed-size KV blocks: reference counts, a free queue in LRU order and a hash map of cached blocks."""

from collections import OrderedDict
from dataclasses import dataclass


class BlockPoolIntegrityError(AssertionError):
    """`BlockPool.check_integrity` found the pool's bookkeeping inconsistent."""


@dataclass(slots=True)
class KVBlock:
    """One block of ``block_size`` token slots in every layer's cache."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


class BlockPool:
    """Owns every KV block.

    A block with ``ref_cnt == 0`` sits in the free queue, oldest release first; it may still
    carry a hash (its contents are cached and can be revived by `touch`) until `allocate`
    hands it out again, which evicts the hash.
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks that `allocate` can hand out now (cached but unreferenced blocks included)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one request (0..1)."""
        return 1.0 - len(self._free) / self.num_blocks

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take ``num_blocks`` blocks from the head of the free queue, or None if there are not enough."""
        if num_blocks > len(self._free):
            return None
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
                self.num_evictions += 1
            block.ref_cnt = 1
            block_ids.append(block_id)
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference to each block; unreferenced ones join the free queue's tail in the given order."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt <= 0:
                raise BlockPoolIntegrityError(f"block {block_id} freed more often than allocated")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block_id] = None

    def touch(self, block_ids: list[int]) -> None:
        """Add a reference to each (cached) block, taking it out of the free queue if it was there."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self._free[block_id]
            block.ref_cnt += 1

    def cache_block(self, block_id: int, block_hash: int) -> None:
        """Record that a full block holds the tokens identified by ``block_hash``."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block_id

    def lookup(self, block_hash: int) -> int | None:
        """The block caching ``block_hash``, or None."""
        return self._cached.get(block_hash)

    def check_integrity(self, references: dict[int, int]) -> None:
        """Raise `BlockPoolIntegrityError` unless the bookkeeping agrees with ``references``.

        ``references`` maps block id to the number of block tables that hold it. Checks: every
        refcount equals its references; the free queue is exactly the unreferenced blocks; the
        hash map and the blocks' hashes agree both ways.
        """
        for block in self.blocks:
            held = references.get(block.block_id, 0)
            if block.ref_cnt != held:
                raise BlockPoolIntegrityError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but {held} references"
                )
            if (block.ref_cnt == 0) != (block.block_id in self._free):
                raise BlockPoolIntegrityError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} vs free queue"
                )
            if (
                block.block_hash is not None
                and self._cached.get(block.block_hash) != block.block_id
            ):
                raise BlockPoolIntegrityError(
                    f"block {block.block_id}: hash missing from the cache map"
                )
        for block_hash, block_id in self._cached.items():
            if self.blocks[block_id].block_hash != block_hash:
                raise BlockPoolIntegrityError(
                    f"cache map names block {block_id} for a hash it does not hold"
                )
        if len(self._free) != sum(1 for b in self.blocks if b.ref_cnt == 0):
            raise BlockPoolIntegrityError("free queue holds duplicates")
