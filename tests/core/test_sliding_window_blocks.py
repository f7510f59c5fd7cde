"""KV blocks that leave the sliding window of every layer go back to the pool (Mistral), and nothing changes.

Unit tests pin the release boundary and the bookkeeping on a bare `KVCacheManager`; engine tests run the
tiny random Mistral (window 16) with blocks of 4 tokens, prompts and generations far longer than the
window, and compare greedy outputs with release switched off.
"""

import dataclasses

import pytest
import torch

from spyglass.core.engine.kv.block_pool import BlockPool, BlockPoolIntegrityError
from spyglass.core.engine.kv.kv_cache_manager import KVCacheManager, PrefixMatch
from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.loaders.load import load_checkpoint
from spyglass.core.models.model_config import FULL, SLIDING

WINDOW = 16  # the tiny Mistral's (tests/conftest.py)
BLOCK = 4
# A window of w positions spans at most w / BLOCK + 1 blocks; the next token may open one more.
MAX_HELD = WINDOW // BLOCK + 2
GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logprobs=2)


class Hooks:
    """Hook relay stand-in: an optional fixed prefix match, announcements ignored."""

    def __init__(self, match: PrefixMatch | None = None):
        self.match = match

    def spyglass_match_prefix(self, **kwargs):
        return self.match

    def spyglass_blocks_full(self, **kwargs):
        pass


def make_request(req_id: str, num_tokens: int) -> Request:
    return Request(req_id, list(range(1, num_tokens + 1)), SamplingParams(max_tokens=8))


# -- the bookkeeping, without a model --------------------------------------------------------------


def test_kv_window_only_when_every_layer_slides(tiny_family_dir):
    mistral = load_checkpoint(str(tiny_family_dir("mistral")), torch.float32).arch
    assert mistral.kv_window() == WINDOW
    # Gemma 2 / 3 and Qwen2 with max_window_layers have full-attention layers: they keep everything.
    assert dataclasses.replace(mistral, layer_types=(SLIDING, FULL)).kv_window() is None
    assert dataclasses.replace(mistral, sliding_window=None).kv_window() is None
    assert dataclasses.replace(mistral, layer_types=(SLIDING, SLIDING)).kv_window() == WINDOW


@pytest.mark.parametrize("window", [1, 4, 7, 8, 9])
def test_release_boundary_is_exact(window):
    # Before a step whose first row sits at position p, block i goes iff every position in it is <= p - w.
    kv = KVCacheManager(BlockPool(16), BLOCK, Hooks(), sliding_window=window)
    request = make_request("a", 48)
    for p in range(48):
        request.num_computed_tokens = p
        assert kv.allocate_slots(request, 1)
        table = kv.block_table("a")
        first_visible = max(0, p - window + 1)
        for i, block_id in enumerate(table):
            released = block_id == kv.null_block_id
            assert released == ((i + 1) * BLOCK - 1 < first_visible), (p, i)
        kv.check_integrity()
    assert kv.num_held_blocks("a") <= -(-window // BLOCK) + 1
    kv.free(request)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks and not kv._num_released
    kv.check_integrity()


def test_released_blocks_count_as_free():
    # Four blocks: without release a 40-token request could not get past position 16.
    kv = KVCacheManager(BlockPool(4), BLOCK, Hooks(), sliding_window=8)
    request = make_request("a", 40)
    for p in range(40):
        request.num_computed_tokens = p
        assert kv.allocate_slots(request, 1), p
        kv.check_integrity()
    assert len(kv.block_table("a")) == 10 and kv.num_held_blocks("a") <= 3
    assert kv.num_cache_blocks == 5 and kv.null_block_id == 4
    kv.free(request)
    assert kv.pool.num_free_blocks == 4


def test_no_window_keeps_every_block():
    kv = KVCacheManager(BlockPool(16), BLOCK, Hooks())
    request = make_request("a", 40)
    assert kv.allocate_slots(request, 8)
    request.num_computed_tokens = 8
    assert kv.allocate_slots(request, 32)
    assert kv.null_block_id not in kv.block_table("a") and kv.num_cache_blocks == 16


def test_null_block_is_never_a_prefix_match():
    kv = KVCacheManager(BlockPool(8), BLOCK, Hooks(PrefixMatch((8,), BLOCK)), sliding_window=8)
    with pytest.raises(ValueError, match="invalid PrefixMatch"):
        kv.match_prefix(make_request("a", 9))


def test_integrity_catches_a_stray_null_entry():
    kv = KVCacheManager(BlockPool(8), BLOCK, Hooks(), sliding_window=8)
    request = make_request("a", 12)
    assert kv.allocate_slots(request, 12)
    kv.block_tables["a"][1] = kv.null_block_id  # released without being given back
    with pytest.raises(BlockPoolIntegrityError, match="null entries"):
        kv.check_integrity()


# -- the engine on the tiny Mistral ----------------------------------------------------------------


@pytest.fixture(scope="module")
def mistral(tiny_family_dir, tiny_engine_factory):
    """Engine factory on the tiny Mistral; ``release=False`` switches block release off."""
    path = tiny_family_dir("mistral")
    make = tiny_engine_factory(path, load_checkpoint(str(path), torch.float32))

    def build(release: bool = True, **options):
        engine = make(block_size=BLOCK, **options)
        assert engine.kv.sliding_window == WINDOW
        if not release:
            engine.kv.sliding_window = None
        return engine

    return build


@pytest.fixture(scope="module")
def prompts(tiny_llama_checkpoint, mixed_texts) -> list[list[int]]:
    tokenizer = tiny_llama_checkpoint.tokenizer
    return [tokenizer.encode(text) for text in mixed_texts]


@pytest.fixture(scope="module")
def kept(mistral, run_engine, prompts):
    """Greedy outputs with every block kept: the reference."""
    return run_engine(mistral(release=False), prompts, GREEDY)


def test_release_leaves_greedy_outputs_unchanged(mistral, run_engine, prompts, kept, same_greedy):
    assert max(map(len, prompts)) + GREEDY.max_tokens > 6 * WINDOW
    for expected, actual in zip(kept, run_engine(mistral(), prompts, GREEDY)):
        same_greedy(expected, actual)


def test_chunked_prefill_and_torch_reference(mistral, run_engine, prompts, kept, same_greedy):
    # Chunks of 12 tokens (not a multiple of the block), the torch reference's gathers over the null block.
    engine = mistral(max_num_batched_tokens=12, attention_backend="torch")
    for expected, actual in zip(kept, run_engine(engine, prompts, GREEDY)):
        same_greedy(expected, actual)


def test_a_long_generation_holds_a_window_of_blocks(mistral, prompts):
    engine = mistral(max_num_batched_tokens=16)
    engine.add_request("long", prompts[-1], GREEDY)
    held = []
    while engine.has_unfinished_requests:
        engine.step()
        if engine.has_unfinished_requests:
            held.append(engine.kv.num_held_blocks("long"))
            # A chunk of 16 holds its own blocks beside the window before it.
            assert held[-1] <= MAX_HELD + 16 // BLOCK
            engine.kv.check_integrity()
    decoding = held[-GREEDY.max_tokens + 2 :]  # after the first decode step's release
    assert (
        max(decoding) <= MAX_HELD and (len(prompts[-1]) + GREEDY.max_tokens) // BLOCK > 4 * MAX_HELD
    )
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks


def test_release_avoids_preemption(
    mistral, run_engine, count_preemptions, prompts, kept, same_greedy
):
    # 48 blocks of 4 = 192 slots: each request fits alone, but all eight at once only with release.
    engine = mistral(num_kv_blocks=48, max_num_batched_tokens=64)
    preemptions = count_preemptions(engine)
    outputs = run_engine(engine, prompts, GREEDY)
    assert preemptions.req_ids == []
    for expected, actual in zip(kept, outputs):
        same_greedy(expected, actual)
    without = mistral(release=False, num_kv_blocks=48, max_num_batched_tokens=64)
    preempted_without = count_preemptions(without)
    run_engine(without, prompts, GREEDY)
    assert len(preempted_without.req_ids) > 0


def test_forced_preemption_balances(
    mistral, run_engine, count_preemptions, prompts, kept, same_greedy
):
    # 32 blocks (the longest request just fits): preemption even with release; run_engine checks the
    # bookkeeping every step and the balance at the end.
    engine = mistral(num_kv_blocks=32, max_num_batched_tokens=32)
    preemptions = count_preemptions(engine)
    outputs = run_engine(engine, prompts, GREEDY)
    assert len(preemptions.req_ids) >= 2
    for expected, actual in zip(kept, outputs):
        same_greedy(expected, actual)


def test_abort_after_release_balances(mistral, prompts):
    engine = mistral()
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, GREEDY)
    for _ in range(6):
        engine.step()
        engine.kv.check_integrity()
    assert any(engine.kv._num_released.values())
    for index in range(len(prompts)):
        engine.abort(f"r{index}")
        engine.kv.check_integrity()
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks


def test_prefix_cache_hits_released_blocks(mistral, run_engine, prompts, kept, same_greedy):
    # Released blocks stay cached in the free queue: a prompt that extends a finished request by its own
    # generated tokens hits every block (most released mid-generation), and so does a second pass.
    engine = mistral(plugins=["fcfs", "prefix_cache"])
    first = run_engine(engine, prompts, GREEDY)
    extended = prompts[4] + list(first[4].outputs[0].token_ids)
    [alone] = run_engine(mistral(release=False), [extended], GREEDY)
    [hit] = run_engine(engine, [extended], GREEDY)
    assert hit.num_cached_tokens == (len(extended) - 1) // BLOCK * BLOCK
    same_greedy(alone, hit)
    second = run_engine(engine, prompts, GREEDY)
    assert [o.num_cached_tokens for o in second] == [(len(p) - 1) // BLOCK * BLOCK for p in prompts]
    for expected, a, b in zip(kept, first, second):
        same_greedy(expected, a)
        same_greedy(expected, b)


def test_mixed_global_and_local_layers_release_nothing(
    tiny_family_dir, tiny_engine_factory, run_engine, prompts
):
    path = tiny_family_dir("gemma2")
    engine = tiny_engine_factory(path, load_checkpoint(str(path), torch.float32))(block_size=BLOCK)
    assert (
        engine.kv.sliding_window is None and engine.kv.num_cache_blocks == engine.kv.pool.num_blocks
    )
    engine.add_request(
        "g", prompts[-1], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    )
    while engine.has_unfinished_requests:
        engine.step()
        if engine.has_unfinished_requests:
            table = engine.kv.block_table("g")
            assert engine.kv.null_block_id not in table and engine.kv.num_held_blocks("g") == len(
                table
            )
