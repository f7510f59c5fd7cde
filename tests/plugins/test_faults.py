"""A faulty plugin or a poisoned request costs at most the requests concerned, never the engine."""

import pytest

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from spyglass.core.engine.token_constraint import TokenConstraint
from spyglass.plugins.fcfs import FcfsPolicy
from spyglass.plugins.priority import PriorityPolicy

POISON = 7  # requests whose prompt starts with this token trip the faulty plugins


STEP_MODES = {
    "in turn": {"async_output": False},
    "async output": {"async_output": True},
    "async scheduling": {"async_output": True, "async_scheduling": True},
}


@pytest.fixture(params=list(STEP_MODES))
def make_engine(make_engine, request):
    """Every fault here in every step mode: with async output a request may fail between its step's
    commit and its outputs, or in a step launched before the failure; with async scheduling also in
    a step scheduled before the previous one's tokens were known. (Speculation schedules in turn.)"""

    def make(**options):
        mode = STEP_MODES[request.param]
        if options.get("speculative"):
            mode = {**mode, "async_scheduling": False}
        return make_engine(**mode, **options)

    return make


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
    assert_failed_alone(
        engine, driver, poisoned, healthy, outputs, "(spyglass_match_prefix) failed: KeyError"
    )


def test_malformed_prefix_match_fails_the_request(make_engine, driver):
    from spyglass.core.engine.kv.kv_cache_manager import PrefixMatch

    class Liar:
        @hookimpl
        def spyglass_match_prefix(self, request, block_pool, block_size):
            return (
                PrefixMatch((10_000,), block_size)
                if request.prompt_token_ids[0] == POISON
                else None
            )

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
    engine = make_engine(
        plugins=[], extra=[PolicyPlugin(FaultyOrder())], scheduling_policy="faulty"
    )
    running = driver.add(engine, [40] * 6, greedy(6))
    engine.step()
    poisoned = driver.add(engine, [POISON] * 6, greedy())
    outputs = driver.drain(engine)
    assert outputs[running.req_id].outputs[0].finish_reason == "length"
    assert poisoned.finish_reason.value == "error"
    assert (
        poisoned.error
        == "scheduling policy 'faulty' failed in admission_order: ValueError: bad ordering"
    )
    assert (
        engine.hooks.num_errors["faulty.admission_order"] == 1
    )  # exported as plugin_hook_errors_total


class FaultyVictim(FcfsPolicy):
    name = "faulty"

    def choose_victim(self, candidates, needy):
        if needy.prompt_token_ids[0] == POISON:
            raise ValueError("no victim for you")
        return super().choose_victim(candidates, needy)


def test_choose_victim_error_fails_the_needy_request(make_engine, driver):
    # 6 blocks of 4 tokens: three 8-token prompts (2 blocks each) fill the pool, then must grow.
    engine = make_engine(
        plugins=[],
        extra=[PolicyPlugin(FaultyVictim())],
        scheduling_policy="faulty",
        num_kv_blocks=6,
    )
    poisoned = driver.add(
        engine, [POISON] * 8, greedy(8)
    )  # first in the batch: first to need a third block
    healthy = [driver.add(engine, [20 + i] * 8, greedy()) for i in range(2)]
    outputs = driver.drain(engine)
    assert_failed_alone(
        engine, driver, poisoned, healthy, outputs, "failed in choose_victim: ValueError"
    )


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


def test_a_poisoned_request_fails_alone_and_its_batch_is_unchanged(make_engine, driver):
    prompts = [[20 + i] * 6 for i in range(3)]

    def run(poison: bool) -> dict[str, list[int]]:
        engine = make_engine(plugins=["fcfs"])
        healthy = [driver.add(engine, prompt, greedy(6)) for prompt in prompts]
        if poison:
            # A request whose parameters slipped past validation: the sampler overflows on it.
            sampled = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=0)
            poisoned = driver.add(engine, [POISON] * 6, sampled)
            poisoned.sampling_params.top_k = 2**63
        outputs = driver.drain(engine)
        if poison:
            assert poisoned.finish_reason.value == "error" and "Overflow" in poisoned.error
        assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
        return [outputs[r.req_id].outputs[0].token_ids for r in healthy]

    assert run(poison=True) == run(poison=False)


class EmptyOrder(FcfsPolicy):
    name = "faulty"

    def admission_order(self, waiting, running):
        return []


class StrangerOrder(FcfsPolicy):
    name = "faulty"

    def admission_order(self, waiting, running):
        return ["not a request", *waiting]


@pytest.mark.parametrize("policy", [EmptyOrder(), StrangerOrder()], ids=["empty", "stranger"])
def test_an_unusable_admission_order_falls_back_to_fcfs(make_engine, driver, policy, caplog):
    engine = make_engine(plugins=[], extra=[PolicyPlugin(policy)], scheduling_policy="faulty")
    requests = [driver.add(engine, [20 + i] * 6, greedy()) for i in range(2)]
    outputs = driver.drain(engine, max_steps=50)  # before, an empty order waited for ever
    assert all(outputs[r.req_id].outputs[0].finish_reason == "length" for r in requests)
    assert engine.hooks.num_errors["faulty.admission_order"] >= 1
    assert "admitting in arrival order" in caplog.text


class Nameless:
    def admission_order(self, waiting, running):
        return waiting

    def choose_victim(self, candidates, needy):
        return candidates[-1]

    def waiting_class(self, request):
        raise RuntimeError("no label")


@pytest.mark.parametrize(
    "policy", [Nameless(), "fcfs", FcfsPolicy], ids=["nameless", "a-string", "a-class"]
)
def test_a_policy_that_breaks_the_protocol_fails_the_start(make_engine, policy):
    with pytest.raises(TypeError, match="SchedulingPolicy protocol"):
        make_engine(plugins=[], extra=[PolicyPlugin(policy)], scheduling_policy="faulty")


class Proposer:
    """Drafts ``drafts`` for every request, or raises when ``drafts`` is an exception."""

    def __init__(self, drafts):
        self.drafts = drafts

    @hookimpl
    def spyglass_propose_drafts(self, method, requests, num_speculative_tokens):
        if isinstance(self.drafts, Exception) and requests:
            raise self.drafts
        return {r.req_id: self.drafts for r in requests}


@pytest.mark.parametrize(
    "drafts",
    [[5, 10**9, 6], [5, -1], ["x"], RuntimeError("drafter down")],
    ids=["out-of-vocab", "negative", "not-an-int", "raises"],
)
def test_a_bad_proposer_costs_speculation_not_requests(make_engine, driver, drafts):
    prompt = [5, 6, 7, 8] * 3
    plain = make_engine(plugins=["fcfs"])
    request = driver.add(plain, prompt, greedy(8))
    expected = driver.drain(plain)[request.req_id].outputs[0].token_ids
    engine = make_engine(plugins=["fcfs"], extra=[Proposer(drafts)], speculative="test")
    request = driver.add(engine, prompt, greedy(8))
    output = driver.drain(engine)[request.req_id].outputs[0]
    assert output.finish_reason == "length" and output.token_ids == expected
    assert engine.hooks.num_errors["test.spyglass_propose_drafts"] >= 1


def test_an_unknown_draft_proposer_fails_the_start(make_engine):
    with pytest.raises(ValueError, match="no plugin provides the draft proposer 'nosuch'"):
        make_engine(plugins=["fcfs", "ngram"], speculative="nosuch")


class GivesOut(TokenConstraint):
    """Allows every token, then refuses the third and says why (a backend's limit hit mid-answer)."""

    def __init__(self):
        self.accepted = 0

    def fill_bitmask(self, bitmask, row):
        bitmask[row] = -1

    def accept(self, token_id):
        if self.accepted == 2:
            return False
        self.accepted += 1
        return True

    def num_valid(self, token_ids):
        return min(len(token_ids), 2 - self.accepted)

    def refusal(self):
        return "too many items (the backend's limit)" if self.accepted == 2 else None


class GivingOutGrammars:
    @hookimpl
    def spyglass_token_constraint(self, spec, tokenizer, vocab_size):
        return GivesOut()


def test_a_grammar_that_gives_out_mid_answer_fails_its_request_saying_why(make_engine, driver):
    engine = make_engine(plugins=["fcfs"], extra=[GivingOutGrammars()])
    healthy = [driver.add(engine, [20 + i] * 6, greedy()) for i in range(2)]
    constrained = greedy(8, structured_output=StructuredOutput("regex", ".*"))
    poisoned = driver.add(engine, [POISON] * 6, constrained)
    outputs = driver.drain(engine)
    assert_failed_alone(
        engine,
        driver,
        poisoned,
        healthy,
        outputs,
        "the grammar rejected sampled token",
    )
    assert poisoned.error.endswith(": too many items (the backend's limit)")
