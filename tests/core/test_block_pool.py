"""BlockPool and KVCacheManager bookkeeping: allocate, free, touch, cache, lookup, evict, and a
check_integrity that bites."""

import pytest

from spyglass.core.engine.kv.block_pool import BlockPool, BlockPoolIntegrityError
from spyglass.core.engine.kv.kv_cache_manager import (
    EXTENT_BLOCKS,
    NO_MATCH,
    KVCacheManager,
    PrefixMatch,
)
from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import SamplingParams


def free_queue(pool: BlockPool) -> list[int]:
    """The free queue in LRU order (the order `allocate` hands blocks out), read without changing it."""
    return list(pool._free)


def test_fresh_pool():
    pool = BlockPool(4)
    assert pool.num_blocks == pool.num_free_blocks == 4
    assert pool.usage == 0.0
    pool.check_integrity({})


def test_pool_needs_a_block():
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)


def test_allocate_takes_from_the_head_and_counts_references():
    pool = BlockPool(4)
    assert pool.allocate(3) == [0, 1, 2]
    assert [b.ref_cnt for b in pool.blocks] == [1, 1, 1, 0]
    assert pool.num_free_blocks == 1
    assert pool.usage == pytest.approx(0.75)
    pool.check_integrity({0: 1, 1: 1, 2: 1})


def test_allocate_all_or_nothing():
    pool = BlockPool(2)
    assert pool.allocate(3) is None
    assert pool.num_free_blocks == 2
    assert pool.allocate(0) == []
    pool.check_integrity({})


def test_free_appends_to_the_tail_in_the_given_order():
    pool = BlockPool(4)
    pool.allocate(4)
    pool.free([2, 0])
    assert free_queue(pool) == [2, 0]
    pool.free([3, 1])
    assert free_queue(pool) == [2, 0, 3, 1]
    assert pool.allocate(2) == [2, 0]
    pool.check_integrity({2: 1, 0: 1})


def test_shared_block_is_free_only_when_the_last_reference_goes():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.touch([block])
    assert pool.blocks[block].ref_cnt == 2
    pool.free([block])
    assert pool.num_free_blocks == 1
    pool.check_integrity({block: 1})
    pool.free([block])
    assert pool.num_free_blocks == 2
    pool.check_integrity({})


def test_double_free_raises():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.free([block])
    with pytest.raises(BlockPoolIntegrityError, match="freed more often"):
        pool.free([block])


def test_cache_block_and_lookup():
    pool = BlockPool(3)
    first, second = pool.allocate(2)
    pool.cache_block(first, 111)
    assert pool.lookup(111) == first
    assert pool.lookup(222) is None
    # A block keeps its first hash, and a hash names one block: later claims are ignored.
    pool.cache_block(first, 222)
    pool.cache_block(second, 111)
    assert pool.lookup(222) is None
    assert pool.lookup(111) == first
    assert pool.blocks[second].block_hash is None
    pool.check_integrity({first: 1, second: 1})


def test_freed_cached_block_stays_cached_and_can_be_revived_by_touch():
    pool = BlockPool(3)
    [block] = pool.allocate(1)
    pool.cache_block(block, 7)
    pool.free([block])
    assert pool.lookup(7) == block and pool.num_free_blocks == 3
    pool.touch([block])
    assert pool.blocks[block].ref_cnt == 1
    assert block not in free_queue(pool)
    assert pool.lookup(7) == block
    assert pool.num_evictions == 0
    pool.check_integrity({block: 1})


def test_allocate_evicts_cached_blocks_in_lru_order():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for block_id, block_hash in zip(blocks, (10, 11, 12)):
        pool.cache_block(block_id, block_hash)
    pool.free([blocks[1], blocks[0], blocks[2]])
    [taken] = pool.allocate(1)
    assert taken == blocks[1]
    assert pool.lookup(11) is None and pool.blocks[taken].block_hash is None
    assert pool.lookup(10) == blocks[0] and pool.lookup(12) == blocks[2]
    assert pool.num_evictions == 1
    pool.check_integrity({taken: 1})
    pool.allocate(2)
    assert pool.num_evictions == 3
    assert pool._cached == {}


# -- check_integrity must fail when the bookkeeping is wrong -----------------------------------


@pytest.fixture
def busy_pool() -> tuple[BlockPool, dict[int, int]]:
    """Four blocks: 0 and 1 held (1 twice, cached), 2 free but cached, 3 free; and the references that match."""
    pool = BlockPool(4)
    pool.allocate(3)
    pool.touch([1])
    pool.cache_block(1, 100)
    pool.cache_block(2, 200)
    pool.free([2])
    references = {0: 1, 1: 2}
    pool.check_integrity(references)
    return pool, references


def test_integrity_detects_refcount_mismatch(busy_pool):
    pool, references = busy_pool
    pool.blocks[1].ref_cnt = 1
    with pytest.raises(BlockPoolIntegrityError, match="block 1: ref_cnt 1 but 2 references"):
        pool.check_integrity(references)


def test_integrity_detects_missing_reference(busy_pool):
    pool, _ = busy_pool
    with pytest.raises(BlockPoolIntegrityError, match="block 0"):
        pool.check_integrity({1: 2})


def test_integrity_detects_free_referenced_block(busy_pool):
    pool, references = busy_pool
    pool._free[0] = None
    with pytest.raises(BlockPoolIntegrityError, match="block 0: ref_cnt 1 vs free queue"):
        pool.check_integrity(references)


def test_integrity_detects_lost_free_block(busy_pool):
    pool, references = busy_pool
    del pool._free[3]
    with pytest.raises(BlockPoolIntegrityError, match="block 3: ref_cnt 0 vs free queue"):
        pool.check_integrity(references)


def test_integrity_detects_unknown_block_in_free_queue(busy_pool):
    pool, references = busy_pool
    pool._free[99] = None
    with pytest.raises(BlockPoolIntegrityError, match="free queue"):
        pool.check_integrity(references)


def test_integrity_detects_hash_missing_from_map(busy_pool):
    pool, references = busy_pool
    del pool._cached[200]
    with pytest.raises(BlockPoolIntegrityError, match="block 2: hash missing"):
        pool.check_integrity(references)


def test_integrity_detects_map_entry_for_wrong_block(busy_pool):
    pool, references = busy_pool
    pool._cached[300] = 3
    with pytest.raises(BlockPoolIntegrityError, match="cache map names block 3"):
        pool.check_integrity(references)


def test_integrity_detects_two_blocks_claiming_one_hash(busy_pool):
    pool, references = busy_pool
    pool.blocks[0].block_hash = 100
    with pytest.raises(BlockPoolIntegrityError, match="block 0: hash missing"):
        pool.check_integrity(references)


# -- KVCacheManager on top of the pool ---------------------------------------------------------


class NoPrefixHooks:
    """The two hooks the manager calls, without any plugin: no prefix hits, full blocks recorded."""

    def __init__(self, match: PrefixMatch | None = None):
        self.match = match
        self.announced: list[tuple[str, list[int], int]] = []

    def spyglass_match_prefix(self, request, **kwargs):
        return self.match

    def spyglass_blocks_full(self, request, block_ids, num_new, **kwargs):
        self.announced.append((request.req_id, list(block_ids), num_new))


def make_request(req_id: str, num_tokens: int) -> Request:
    return Request(req_id, list(range(1, num_tokens + 1)), SamplingParams(max_tokens=8))


def test_allocate_slots_rounds_up_to_blocks_and_grows():
    kv = KVCacheManager(BlockPool(8), block_size=4, hooks=NoPrefixHooks())
    request = make_request("a", 6)
    assert kv.allocate_slots(request, 6)
    assert len(kv.block_table("a")) == 2
    request.num_computed_tokens = 6
    assert kv.allocate_slots(request, 2)  # positions 6, 7 still fit block 2
    assert len(kv.block_table("a")) == 2
    assert kv.allocate_slots(request, 3)
    assert len(kv.block_table("a")) == 3
    kv.check_integrity()


def test_tables_grow_in_contiguous_extents_while_the_pool_is_roomy():
    kv = KVCacheManager(BlockPool(4 * EXTENT_BLOCKS), block_size=4, hooks=NoPrefixHooks())
    first, second = make_request("a", 6), make_request("b", 6)
    assert kv.allocate_slots(first, 6) and kv.allocate_slots(second, 6)
    assert kv.block_table("a") == list(range(EXTENT_BLOCKS))
    assert kv.block_table("b") == list(range(EXTENT_BLOCKS, 2 * EXTENT_BLOCKS))
    first.num_computed_tokens = 6
    assert kv.allocate_slots(first, 4 * EXTENT_BLOCKS - 6)  # fills its extent: nothing new
    assert len(kv.block_table("a")) == EXTENT_BLOCKS
    # Half the pool is in use now: a third request takes exactly what it needs.
    third = make_request("c", 6)
    assert kv.allocate_slots(third, 6)
    assert len(kv.block_table("c")) == 2
    kv.check_integrity()
    for request in (first, second, third):
        kv.free(request)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks
    kv.check_integrity()


def test_allocate_slots_failure_changes_nothing():
    kv = KVCacheManager(BlockPool(2), block_size=4, hooks=NoPrefixHooks())
    request = make_request("a", 12)
    assert not kv.allocate_slots(request, 12)
    assert "a" not in kv.block_tables and kv.pool.num_free_blocks == 2
    kv.check_integrity()


def test_free_returns_blocks_tail_first():
    kv = KVCacheManager(BlockPool(4), block_size=4, hooks=NoPrefixHooks())
    request = make_request("a", 12)
    assert kv.allocate_slots(request, 12)
    table = list(kv.block_table("a"))
    kv.free(request)
    assert free_queue(kv.pool)[-3:] == table[::-1]
    assert kv.pool.num_free_blocks == 4
    kv.check_integrity()


def test_prefix_hit_shares_blocks_and_counts_revived_ones():
    pool = BlockPool(4)
    hooks = NoPrefixHooks()
    kv = KVCacheManager(pool, block_size=4, hooks=hooks)
    first = make_request("a", 9)
    assert kv.allocate_slots(first, 9)
    cached = kv.block_table("a")[:2]
    pool.cache_block(cached[0], 1)
    pool.cache_block(cached[1], 2)
    kv.free(first)
    hooks.match = PrefixMatch(tuple(cached), 8)
    second = make_request("b", 10)
    match = kv.match_prefix(second)
    assert match.block_ids == tuple(cached)
    # Both cached blocks sit in the free queue: reviving them costs two of the four free blocks.
    assert kv.allocate_slots(second, 2, match)
    assert kv.block_table("b")[:2] == cached
    assert pool.num_free_blocks == 1
    kv.check_integrity()


def test_prefix_match_never_covers_the_last_prompt_token():
    hooks = NoPrefixHooks(PrefixMatch((0, 1), 8))
    kv = KVCacheManager(BlockPool(4), block_size=4, hooks=hooks)
    assert kv.match_prefix(make_request("a", 8)) == PrefixMatch((0,), 4)
    assert kv.match_prefix(make_request("b", 9)) == PrefixMatch((0, 1), 8)
    hooks.match = None
    assert kv.match_prefix(make_request("c", 9)) is NO_MATCH


def test_announce_full_blocks_only_new_ones():
    hooks = NoPrefixHooks()
    kv = KVCacheManager(BlockPool(4), block_size=4, hooks=hooks)
    request = make_request("a", 10)
    assert kv.allocate_slots(request, 10)
    request.num_computed_tokens = 3
    kv.announce_full_blocks(request)
    assert hooks.announced == []
    request.num_computed_tokens = 10
    kv.announce_full_blocks(request)
    kv.announce_full_blocks(request)
    assert hooks.announced == [("a", kv.block_table("a")[:2], 2)]


def test_manager_integrity_sees_a_table_the_pool_does_not_know():
    kv = KVCacheManager(BlockPool(4), block_size=4, hooks=NoPrefixHooks())
    assert kv.allocate_slots(make_request("a", 4), 4)
    kv.check_integrity()
    kv.block_tables["ghost"] = [3]
    with pytest.raises(BlockPoolIntegrityError, match="block 3"):
        kv.check_integrity()
