"""A faulty plugin costs at most the requests it was deciding about, never the engine."""

from spyglass.core.hookspecs import hookimpl
from spyglass.core.sampling_params import SamplingParams
from spyglass.plugins.fcfs import FcfsPolicy
from spyglass.plugins.priority import PriorityPolicy

POISON = 7  # requests whose prompt starts with this token trip the faulty plugins


def greedy(max_tokens: int = 3, **options) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **options)


class RaisingEvents:
    """Raises in two event hooks, for every request."""

    @hookimpl
    def spyglass_request_added(self, request):
        raise RuntimeError("audit backend down")

    @hookimpl
    def spyglass_step_finished(self, stats):
        raise RuntimeError("no disk")


class PolicyPlugin:
    """Provides one policy object under the name "faulty"."""

    def __init__(self, policy):
        self.policy = policy

    @hookimpl
    def spyglass_scheduling_policy(self, name, config):
        return self.policy if name == "faulty" else None


class RaisingPrefixCache:
    @hookimpl
    def spyglass_match_prefix(self, request, block_pool, block_size):
        if request.prompt_token_ids[0] == POISON:
            raise KeyError("corrupt index")
        return None


def test_event_hook_errors_are_logged_counted_and_harmless(make_engine, driver, caplog):
    engine = make_engine(plugins=["fcfs"], extra=[RaisingEvents()])
    requests = [driver.add(engine, [11, 12, 13], greedy()) for _ in range(2)]
    outputs = driver.drain(engine)
    assert all(outputs[r.req_id].outputs[0].finish_reason == "length" for r in requests)
    errors = engine.hooks.num_errors
    assert errors[next(k for k in errors if k.endswith(".spyglass_request_added"))] == 2
    assert errors[next(k for k in errors if k.endswith(".spyglass_step_finished"))] >= 3
    assert engine.info.hook_errors is errors  # exported by the metrics plugin
    assert "audit backend down" in caplog.text


def run_mixed(engine, driver, poisoned_max_tokens: int = 3):
    """One poisoned request among healthy ones; returns (poisoned, healthy, outputs)."""
    healthy = [driver.add(engine, [20 + i] * 6, greedy()) for i in range(2)]
    poisoned = driver.add(engine, [POISON] * 6, greedy(poisoned_max_tokens))
    outputs = driver.drain(engine)
    return poisoned, healthy, outputs


def assert_failed_alone(engine, driver, poisoned, healthy, outputs, message: str):
    assert poisoned.finish_reason.value == "error"
    assert message in poisoned.error
    assert outputs[poisoned.req_id].outputs[0].finish_reason == "error"
    assert all(outputs[r.req_id].outputs[0].finish_reason == "length" for r in healthy)
    later = driver.add(engine, [30] * 6, greedy())  # and the engine keeps serving
    assert driver.drain(engine)[later.req_id].outputs[0].finish_reason == "length"
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks


def test_prefix_match_error_fails_only_that_request(make_engine, driver):
    engine = make_engine(plugins=["fcfs"], extra=[RaisingPrefixCache()])
    poisoned, healthy, outputs = run_mixed(engine, driver)
    assert_failed_alone(engine, driver, poisoned, healthy, outputs, "(spyglass_match_prefix) failed: KeyError")


def test_malformed_prefix_match_fails_the_request(make_engine, driver):
    from spyglass.core.kv_cache_manager import PrefixMatch

    class Liar:
        @hookimpl
        def spyglass_match_prefix(self, request, block_pool, block_size):
            return PrefixMatch((10_000,), block_size) if request.prompt_token_ids[0] == POISON else None

    engine = make_engine(plugins=["fcfs"], extra=[Liar()])
    poisoned, healthy, outputs = run_mixed(engine, driver)
    assert_failed_alone(engine, driver, poisoned, healthy, outputs, "invalid PrefixMatch")


class FaultyOrder(FcfsPolicy):
    name = "faulty"
    armed = True

    def admission_order(self, waiting, running):
        if self.armed and any(r.prompt_token_ids[0] == POISON for r in waiting):
            self.armed = False
            raise ValueError("bad ordering")
        return waiting


def test_admission_order_error_fails_the_waiting_requests_only(make_engine, driver):
    engine = make_engine(plugins=[], extra=[PolicyPlugin(FaultyOrder())], scheduling_policy="faulty")
    running = driver.add(engine, [40] * 6, greedy(6))
    engine.step()
    poisoned = driver.add(engine, [POISON] * 6, greedy())
    outputs = driver.drain(engine)
    assert outputs[running.req_id].outputs[0].finish_reason == "length"
    assert poisoned.finish_reason.value == "error"
    assert "scheduling policy 'faulty' failed in admission_order: ValueError: bad ordering" == poisoned.error


class FaultyVictim(FcfsPolicy):
    name = "faulty"

    def choose_victim(self, candidates, needy):
        if needy.prompt_token_ids[0] == POISON:
            raise ValueError("no victim for you")
        return super().choose_victim(candidates, needy)


def test_choose_victim_error_fails_the_needy_request(make_engine, driver):
    # 6 blocks of 4 tokens: three 8-token prompts (2 blocks each) fill the pool, then must grow.
    engine = make_engine(plugins=[], extra=[PolicyPlugin(FaultyVictim())], scheduling_policy="faulty", num_kv_blocks=6)
    poisoned = driver.add(engine, [POISON] * 8, greedy(8))  # first in the batch: first to need a third block
    healthy = [driver.add(engine, [20 + i] * 8, greedy()) for i in range(2)]
    outputs = driver.drain(engine)
    assert_failed_alone(engine, driver, poisoned, healthy, outputs, "failed in choose_victim: ValueError")


class FaultyPreempt(PriorityPolicy):
    name = "faulty"

    def should_preempt_for(self, waiting_request, running):
        raise ValueError("cannot decide")


def test_should_preempt_for_error_fails_the_waiting_request(make_engine, driver):
    plugin = PolicyPlugin(FaultyPreempt())
    engine = make_engine(plugins=[], extra=[plugin], scheduling_policy="faulty", num_kv_blocks=10)
    low = driver.add(engine, list(range(100, 120)), greedy(16, priority=5))
    for _ in range(3):
        engine.step()
    high = driver.add(engine, list(range(200, 218)), greedy(4, priority=0))
    outputs = driver.drain(engine)
    assert outputs[low.req_id].outputs[0].finish_reason == "length"
    assert high.finish_reason.value == "error" and "should_preempt_for" in high.error
