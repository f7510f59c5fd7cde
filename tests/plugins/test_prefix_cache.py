"""Automatic prefix caching: same outputs, real hits, sound bookkeeping under random load, LRU eviction."""

import random
import weakref

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.plugins.prefix_cache import block_hashes


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def counter(name: str, engine) -> float:
    labels = {"model_name": engine.model_name, "engine": engine.engine_id}
    return REGISTRY.get_sample_value(f"spyglass:{name}_total", labels) or 0.0


def test_outputs_identical_with_and_without_cache_on_the_default_model(make_default_engine, driver):
    system = list(range(1000, 1037))  # 37 shared tokens: two full blocks of 16 and a partial one
    prompts = [system + [2000 + i, 3000 + i, 4000 + i] for i in range(4)]
    results = {}
    for plugins in (["fcfs"], ["fcfs", "prefix_cache"]):
        engine = make_default_engine(plugins=plugins)
        first = driver.add(engine, prompts[0], greedy(6))
        driver.drain(engine)  # warms the cache, then the rest arrive together
        rest = [driver.add(engine, p, greedy(6)) for p in prompts[1:]]
        driver.drain(engine)
        results[len(plugins)] = [(r.output_token_ids, r.num_cached_tokens) for r in [first, *rest]]
    uncached, cached = results[1], results[2]
    assert [tokens for tokens, _ in cached] == [tokens for tokens, _ in uncached]
    assert [hit for _, hit in uncached] == [0, 0, 0, 0]
    assert [hit for _, hit in cached] == [0, 32, 32, 32]


def test_hits_are_counted_and_never_cover_the_last_prompt_token(make_engine, driver):
    engine = make_engine()
    prompt = list(range(500, 512))  # exactly three blocks of 4
    queries, hits = counter("prefix_cache_queries", engine), counter("prefix_cache_hits", engine)
    first = driver.add(engine, prompt, greedy(3))
    driver.drain(engine)
    again = driver.add(engine, prompt, greedy(3))
    longer = driver.add(engine, prompt + [9, 9, 9], greedy(3))
    outputs = driver.drain(engine)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 8  # the last block holds the last prompt token: recomputed
    assert longer.num_cached_tokens == 12
    assert outputs[again.req_id].num_cached_tokens == 8  # what the API reports as cached_tokens
    assert again.output_token_ids == first.output_token_ids
    assert counter("prefix_cache_queries", engine) - queries == 12 + 12 + 15
    assert counter("prefix_cache_hits", engine) - hits == 8 + 12


def test_generated_tokens_are_cached_too(make_engine, driver):
    engine = make_engine()
    first = driver.add(engine, [7, 8, 9, 10, 11], greedy(8))
    driver.drain(engine)
    follow_up = driver.add(
        engine, first.all_token_ids + [12], greedy(2)
    )  # a multi-turn continuation
    driver.drain(engine)
    assert (
        follow_up.num_cached_tokens == 12
    )  # 13 known tokens: three full blocks, the last one recomputed


def test_chained_hashes_depend_on_every_earlier_block(make_engine, driver):
    engine = make_engine(plugins=["fcfs"])
    a = driver.add(engine, [1, 2, 3, 4, 5, 6, 7, 8, 9], greedy(1))
    b = driver.add(engine, [9, 2, 3, 4, 5, 6, 7, 8, 9], greedy(1))
    names = weakref.WeakKeyDictionary()
    ha, hb = block_hashes(a, 2, 4, names), block_hashes(b, 2, 4, names)
    assert ha[0] != hb[0] and ha[1] != hb[1]  # same second block, different history
    assert block_hashes(a, 2, 4, names) == ha == block_hashes(a, 2, 4, weakref.WeakKeyDictionary())


def test_eviction_under_a_tiny_kv_budget(make_engine, driver):
    engine = make_engine(num_kv_blocks=8)
    prompt = list(range(600, 612))
    driver.add(engine, prompt, greedy(2))
    driver.drain(engine)
    hit = driver.add(engine, prompt, greedy(2))
    driver.drain(engine)
    assert hit.num_cached_tokens == 8
    pool = engine.kv.pool
    assert (
        len(pool._cached) > 0 and pool.num_free_blocks == pool.num_blocks
    )  # cached blocks sit in the free queue
    for i in range(3):  # unrelated work needing every block evicts the cached ones, oldest first
        driver.add(engine, list(range(700 + 40 * i, 728 + 40 * i)), greedy(4))
        driver.drain(engine)
    assert pool.num_evictions > 0
    again = driver.add(engine, prompt, greedy(2))
    driver.drain(engine)
    assert again.num_cached_tokens == 0


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**16),
    num_requests=st.integers(2, 10),
    num_blocks=st.integers(6, 16),
    abort_rate=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_integrity_under_random_shared_prefix_load(
    make_engine, driver, seed, num_requests, num_blocks, abort_rate
):
    rng = random.Random(seed)
    engine = make_engine(
        num_kv_blocks=num_blocks, max_num_batched_tokens=16, max_num_seqs=rng.choice([2, 4, 8])
    )
    prefixes = [
        [rng.randrange(100, 200) for _ in range(rng.choice([0, 3, 4, 8]))] for _ in range(3)
    ]
    pending = []
    for _ in range(num_requests):
        prompt = rng.choice(prefixes) + [rng.randrange(100, 200) for _ in range(rng.randint(1, 6))]
        pending.append((prompt, greedy(rng.randint(1, 8))))
    live = []
    for _ in range(2000):
        if pending and rng.random() < 0.5:
            live.append(driver.add(engine, *pending.pop()))
        if live and rng.random() < abort_rate:
            engine.abort(rng.choice(live).req_id)
        engine.step()
        engine.kv.check_integrity()
        if not pending and not engine.has_unfinished_requests:
            break
    assert not engine.has_unfinished_requests
    assert all(
        r.finish_reason is not None and r.finish_reason.value in ("length", "abort") for r in live
    )
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks


def test_random_load_really_preempts_and_hits(make_engine, driver):
    """The random workload above is not vacuous: at its tightest it preempts and reuses prefixes."""
    engine = make_engine(num_kv_blocks=6, max_num_batched_tokens=16, max_num_seqs=8)
    prefix = list(range(100, 108))
    requests = [driver.add(engine, prefix + [200 + i, 201 + i], greedy(8)) for i in range(6)]
    driver.drain(engine)
    assert sum(r.num_preemptions for r in requests) > 0
    assert sum(r.num_cached_tokens for r in requests) > 0
