"""Speculative decoding: greedy identity for every proposer, unchanged sampling distribution, KV integrity."""

import collections
import itertools
import random

import pytest

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.plugin_context import PluginContext
from spyglass.core.engine.plugin_manager import create_plugin_manager
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.plugins.ngram import propose

PROMPTS = [
    "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Write one sentence about the sea.",
    "Count: 1, 2, 3, 4, 5, 6, 7, 8,",
    "请重复：我喜欢学习。我喜欢学习。",
]


def _run(engine: LLMEngine, prompts, params) -> dict[str, list[int]]:
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), engine.tokenizer.encode(prompt), params)
    outputs = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = output.outputs[0].token_ids
        engine.kv.check_integrity()
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    return outputs


class Acceptance:
    """Counts verified drafts through the public hook."""

    def __init__(self):
        self.drafts = self.accepted = 0

    @hookimpl
    def spyglass_drafts_verified(self, request, num_draft_tokens, num_accepted_tokens):
        """Add one step's counts."""
        self.drafts += num_draft_tokens
        self.accepted += num_accepted_tokens


def _with_plugins(config: EngineConfig, *plugins) -> LLMEngine:
    """An engine with ``plugins`` registered before it starts (a proposer is checked at start)."""
    pm = create_plugin_manager(
        config.plugins, config.disabled_plugins, PluginContext.for_config(config)
    )
    for plugin in plugins:
        pm.register(plugin)
    return LLMEngine(config, plugin_manager=pm)


def _engine(model, speculative=None, checkpoint=None, **options) -> LLMEngine:
    config = EngineConfig(
        model=model,
        dtype="float32",
        speculative=speculative,
        num_speculative_tokens=3,
        max_num_batched_tokens=64,
        num_kv_blocks=40,
        block_size=8,
        **options,
    )
    return LLMEngine(config, checkpoint=checkpoint)


def test_ngram_proposal_follows_the_last_match():
    assert propose([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert propose([5, 6, 7], 3) == []


def test_ngram_drafts_no_more_tokens_than_the_match_is_long():
    assert propose([4, 8, 5, 6, 7, 8], 4) == [5]
    assert propose([4, 7, 8, 5, 6, 7, 8], 4) == [5, 6]
    assert propose([1, 2, 3, 4, 5, 9, 1, 2, 3, 4], 8) == [5, 9, 1, 2]
    assert propose([1, 2, 3, 4, 5, 9, 1, 2, 3, 4], 3) == [5, 9, 1]


def test_ngram_matches_whole_tokens_only():
    # As 4-byte items, 256 then 0 is 00 01 00 00 00 00 00 00: token 1's bytes (01 00 00 00) start
    # one byte in, which is not a token boundary, so it is no match.
    assert propose([256, 0, 5, 1], 2) == []
    assert propose([1, 256, 0, 5, 1], 2) == [256]


def _propose_by_slices(token_ids: list[int], num_tokens: int) -> list[int]:
    """The proposal's definition, spelled out: longest suffix (4 tokens down to 1), latest match."""
    for n in range(min(4, len(token_ids) - 1), 0, -1):
        for start in range(len(token_ids) - n - 1, -1, -1):
            if token_ids[start : start + n] == token_ids[-n:]:
                return token_ids[start + n : start + n + min(n, num_tokens)]
    return []


def test_ngram_byte_search_equals_the_definition_on_random_histories():
    rng = random.Random(0)
    for _ in range(3000):
        vocab = rng.choice([2, 3, 7, 300, 70_000])
        history = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        k = rng.randint(1, 6)
        assert propose(history, k) == _propose_by_slices(history, k), (history, k)


@pytest.fixture(scope="module")
def greedy_reference(default_model_path):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    return _run(_engine(str(default_model_path)), PROMPTS, params)


@pytest.mark.slow
@pytest.mark.parametrize(
    "speculative, options",
    [
        ("ngram", {}),
        ("self", {"self_draft_layers": "12"}),
        ("self", {"self_draft_dtype": "bfloat16"}),
    ],
)
def test_greedy_output_is_identical_with_speculation(
    default_model_path, greedy_reference, speculative, options
):
    # A tiny KV budget and small chunks: speculation runs beside chunked prefill, preemption and prefix reuse.
    engine = _engine(str(default_model_path), speculative, plugin_options=options)
    counter = Acceptance()
    engine.plugin_manager.register(counter)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    assert _run(engine, PROMPTS, params) == greedy_reference
    assert counter.drafts > 0 and 0 < counter.accepted <= counter.drafts


@pytest.mark.slow
def test_greedy_identity_with_a_separate_draft_model(
    default_model_path, greedy_reference, tiny_llama_dir
):
    # A tiny random model sharing the vocabulary: nearly every draft is rejected, output must not change.
    engine = _engine(
        str(default_model_path), "draft", plugin_options={"draft_model": str(tiny_llama_dir)}
    )
    counter = Acceptance()
    engine.plugin_manager.register(counter)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    assert _run(engine, PROMPTS, params) == greedy_reference
    assert counter.drafts > 0


class BigramProposer:
    """Drafts each token as the most frequent successor of the previous one in a reference sample."""

    def __init__(self, sequences: list[list[int]]):
        successors: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        for sequence in sequences:
            for previous, token in itertools.pairwise(sequence):
                successors[previous][token] += 1
        self.next_token = {
            previous: counts.most_common(1)[0][0] for previous, counts in successors.items()
        }

    @hookimpl
    def spyglass_propose_drafts(self, method, requests, num_speculative_tokens):
        """Chain the most frequent successors from each request's last token."""
        drafts = {}
        for request in requests:
            chain, last = [], request.all_token_ids[-1]
            while len(chain) < num_speculative_tokens and last in self.next_token:
                last = self.next_token[last]
                chain.append(last)
            drafts[request.req_id] = chain
        return drafts


def _sample(engine: LLMEngine, num_samples: int) -> list[list[int]]:
    prompt = engine.tokenizer.encode("The weather today is")
    for seed in range(num_samples):
        params = SamplingParams(temperature=1.0, top_k=3, max_tokens=4, ignore_eos=True, seed=seed)
        engine.add_request(f"s{seed}", prompt, params)
    sequences = []
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                sequences.append(output.outputs[0].token_ids)
        engine.kv.check_integrity()
    return sequences


@pytest.mark.timeout(600)
def test_sampled_distribution_is_unchanged(tiny_llama_dir):
    """Chi-square homogeneity test on the joint distribution of the two tokens drafts decide.

    Both tokens come out of one verification step (two drafts). Significance 0.001; seeds are
    fixed, so the outcome is deterministic.
    """
    num_samples = 1200
    options = dict(
        model=str(tiny_llama_dir),
        dtype="float32",
        max_num_seqs=256,
        num_kv_blocks=2048,
        block_size=16,
    )
    reference = _sample(LLMEngine(EngineConfig(**options)), num_samples)
    counter = Acceptance()
    engine = _with_plugins(
        EngineConfig(**options, speculative="test", num_speculative_tokens=2),
        BigramProposer(reference),
        counter,
    )
    speculative = collections.Counter(tuple(s[1:3]) for s in _sample(engine, num_samples))
    # Whatever the proposer learnt from the reference, correct verification leaves the distribution as it was.
    plain = collections.Counter(tuple(s[1:3]) for s in reference)
    assert 0.1 < counter.accepted / counter.drafts < 0.95, (
        "both acceptance and rejection must be exercised"
    )
    cells = [c for c in set(plain) | set(speculative) if plain[c] + speculative[c] >= 10]
    statistic = sum((plain[c] - speculative[c]) ** 2 / (plain[c] + speculative[c]) for c in cells)
    critical = CHI2_CRITICAL_0_001[min(len(cells) - 1, max(CHI2_CRITICAL_0_001))]
    assert len(cells) >= 5
    assert statistic < critical, f"chi-square {statistic:.1f} >= {critical} over {len(cells)} cells"


# Upper 0.001 quantiles of the chi-square distribution by degrees of freedom.
CHI2_CRITICAL_0_001 = {
    4: 18.47,
    5: 20.52,
    6: 22.46,
    7: 24.32,
    8: 26.12,
    9: 27.88,
    10: 29.59,
    11: 31.26,
    12: 32.91,
    13: 34.53,
    14: 36.12,
    15: 37.70,
    16: 39.25,
    17: 40.79,
    18: 42.31,
    19: 43.82,
    20: 45.31,
    21: 46.80,
    22: 48.27,
    23: 49.73,
    24: 51.18,
    25: 52.62,
    26: 54.05,
}


class ConstantProposer:
    """Always proposes the same drafts."""

    def __init__(self, drafts: list[int]):
        self.drafts = drafts

    @hookimpl
    def spyglass_propose_drafts(self, method, requests, num_speculative_tokens):
        """The fixed drafts for every request."""
        return {r.req_id: self.drafts for r in requests}


def test_speculation_is_counted_in_metrics(tiny_llama_dir):
    from prometheus_client import REGISTRY

    counter = Acceptance()
    config = EngineConfig(model=str(tiny_llama_dir), dtype="float32", speculative="test")
    engine = _with_plugins(config, ConstantProposer([5, 6, 7]), counter)
    labels = {"model_name": engine.model_name, "engine": engine.engine_id}
    before = {
        name: REGISTRY.get_sample_value(f"spyglass:spec_decode_{name}_total", labels) or 0.0
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    }
    engine.add_request(
        "r", [5, 6, 7, 8] * 12, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    )
    while engine.has_unfinished_requests:
        engine.step()
    after = {
        name: REGISTRY.get_sample_value(f"spyglass:spec_decode_{name}_total", labels)
        for name in before
    }
    assert counter.drafts > 0
    assert after["num_draft_tokens"] - before["num_draft_tokens"] == counter.drafts
    assert after["num_accepted_tokens"] - before["num_accepted_tokens"] == counter.accepted
    assert after["num_drafts"] > before["num_drafts"]
