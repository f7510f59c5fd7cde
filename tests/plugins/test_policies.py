"""Each scheduling-policy plugin's ordering on the tiny model: priority, preemption, static, fair, slo."""

import pytest
from prometheus_client import REGISTRY

from spyglass.core.engine.sampling_params import SamplingParams


def greedy(max_tokens: int, **options) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **options)


def admission_order(requests) -> list:
    """Requests sorted by when they were first scheduled (ties keep the given order)."""
    return sorted(requests, key=lambda r: r.times.first_scheduled)


def test_priority_admits_lower_numbers_first(make_engine, driver):
    engine = make_engine(plugins=["priority"], scheduling_policy="priority", max_num_seqs=1)
    requests = [
        driver.add(engine, [10 + i] * 6, greedy(2, priority=p)) for i, p in enumerate([3, 1, 2, 1])
    ]
    driver.drain(engine)
    assert [r.sampling_params.priority for r in admission_order(requests)] == [1, 1, 2, 3]
    assert admission_order(requests)[:2] == [
        requests[1],
        requests[3],
    ]  # equal priority: arrival order


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_high_priority_arrival_preempts_low_priority_work(make_engine, driver, policy):
    # 10 blocks of 4 tokens: the low-priority request holds 6 blocks when the 18-token newcomer (5 blocks) arrives.
    engine = make_engine(plugins=[policy], scheduling_policy=policy, num_kv_blocks=10)
    low = driver.add(engine, list(range(100, 120)), greedy(16, priority=5))
    for _ in range(3):
        engine.step()
    high = driver.add(engine, list(range(200, 218)), greedy(4, priority=0))
    driver.drain(engine)
    assert low.finish_reason.value == high.finish_reason.value == "length"
    if policy == "priority":
        assert low.num_preemptions >= 1 and high.times.finished < low.times.finished
    else:  # FCFS never preempts running work for a newcomer: the newcomer waits
        assert low.num_preemptions == 0 and high.times.first_scheduled > low.times.finished


def test_static_admits_a_batch_together_and_waits_for_its_longest_member(make_engine, driver):
    engine = make_engine(plugins=["static"], scheduling_policy="static", max_num_seqs=2)
    requests = [driver.add(engine, [20 + i] * 5, greedy(n)) for i, n in enumerate([2, 8, 2, 2])]
    driver.drain(engine)
    first, longest, third, fourth = requests
    assert first.times.first_scheduled == longest.times.first_scheduled
    assert third.times.first_scheduled > longest.times.finished  # not when the short one finished
    assert third.times.first_scheduled == fourth.times.first_scheduled


def test_fcfs_refills_the_batch_as_soon_as_a_seat_frees(make_engine, driver):
    engine = make_engine(plugins=["fcfs"], max_num_seqs=2)
    requests = [driver.add(engine, [20 + i] * 5, greedy(n)) for i, n in enumerate([2, 8, 2, 2])]
    driver.drain(engine)
    assert requests[2].times.first_scheduled < requests[1].times.finished


def test_fair_alternates_tenants(make_engine, driver):
    engine = make_engine(plugins=["fair"], scheduling_policy="fair", max_num_seqs=1)
    requests = [
        driver.add(engine, [30 + i] * 5, greedy(2), tenant=t) for i, t in enumerate("AAABBB")
    ]
    driver.drain(engine)
    assert [r.attributes["tenant"] for r in admission_order(requests)] == list("ABABAB")


def test_fair_weights_from_plugin_options(make_engine, driver):
    engine = make_engine(
        plugins=["fair"],
        scheduling_policy="fair",
        max_num_seqs=1,
        plugin_options={"fair_weights": "A=2"},
    )
    requests = [driver.add(engine, [30 + i] * 5, greedy(1), user=t) for i, t in enumerate("AAAABB")]
    driver.drain(engine)
    # A's requests rank at 0, .5, 1, 1.5 and B's at 0, 1 (ties by arrival).
    assert "".join(r.attributes["user"] for r in admission_order(requests)) == "ABAABA"


def test_slo_runs_earliest_deadline_first_and_counts_misses(make_engine, driver):
    engine = make_engine(
        plugins=["slo"],
        scheduling_policy="slo",
        max_num_seqs=1,
        plugin_options={"slo_ttft": "gold=0.5"},
    )
    targets = [30.0, 10.0, None, 20.0]  # None: the tenant default, 0.5 s
    requests = [
        driver.add(
            engine,
            [40 + i] * 5,
            greedy(2, extra={} if t is None else {"ttft_slo_s": t}),
            tenant="gold",
        )
        for i, t in enumerate(targets)
    ]
    late = driver.add(engine, [50] * 5, greedy(2, extra={"ttft_slo_s": 0.0}))
    before = (
        REGISTRY.get_sample_value(
            "spyglass:slo_deadline_misses_total",
            {"model_name": engine.model_name, "engine": engine.engine_id},
        )
        or 0
    )
    driver.drain(engine)
    assert admission_order(requests + [late])[0] is late
    assert admission_order(requests) == [requests[2], requests[1], requests[3], requests[0]]
    policy = engine.scheduler.policy
    assert policy.num_deadline_misses >= 1
    after = REGISTRY.get_sample_value(
        "spyglass:slo_deadline_misses_total",
        {"model_name": engine.model_name, "engine": engine.engine_id},
    )
    assert after - before == policy.num_deadline_misses
