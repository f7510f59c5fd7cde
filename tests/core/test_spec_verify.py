"""`verify_drafts` checks a step's drafted requests together on the device: greedy requests against
the definition (the longest prefix equal to the argmax, then the argmax), sampled ones by the
distribution of what they append (that of sampling token by token), seeded ones alike whatever
their companions. A step with drafts is sampled on the device and not finished at launch."""

import itertools
import math
import random
from collections import Counter

import pytest
import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.spec_verify import verify_drafts
from spyglass.core.engine.sampling_params import SamplingParams
from tests.core.conftest import ON_CUDA

VOCAB = 6


def _request(params: SamplingParams, drafts: list[int], at: int = 0) -> Request:
    request = Request(f"r{at}", [1, 2, 3], params)
    request.spec_token_ids = list(drafts)
    return request


def _appended(token_ids: torch.Tensor) -> list[list[int]]:
    return [[t for t in row if t >= 0] for row in token_ids.cpu().tolist()]


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_greedy_requests_accept_the_prefix_equal_to_the_argmax(device):
    rng = random.Random(0)
    greedy = SamplingParams(temperature=0)
    for _ in range(30):
        drafts = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))] for _ in range(5)]
        logits = torch.randn(sum(len(d) + 1 for d in drafts), VOCAB)
        targets = logits.argmax(dim=-1).tolist()
        # Drafts that often follow the argmax for a while.
        row = 0
        for own in drafts:
            agree = rng.randint(0, len(own))
            own[:agree] = targets[row : row + agree]
            row += len(own) + 1
        requests = [_request(greedy, d, at) for at, d in enumerate(drafts)]
        appended = _appended(verify_drafts(logits.to(device), requests, drafts))
        row = 0
        for own, tokens in zip(drafts, appended):
            accepted = next((i for i, d in enumerate(own) if d != targets[row + i]), len(own))
            assert tokens == own[:accepted] + [targets[row + accepted]]
            row += len(own) + 1


def _probs(logits: torch.Tensor, top_k: int) -> list[float]:
    """The definition: softmax, the ``top_k`` most likely kept and renormalised."""
    probs = logits.softmax(dim=-1)
    kept = torch.zeros_like(probs)
    top = probs.topk(top_k)
    kept[top.indices] = top.values
    return (kept / kept.sum()).tolist()


@pytest.mark.parametrize("top_k", [0, 4], ids=["plain", "top-k"])
@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_what_sampled_requests_append_follows_token_by_token_sampling(top_k, device):
    """20,000 requests with two drafts each, in one call: each appended sequence as often as
    sampling token by token would give it (chi-square, significance 0.001)."""
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0]]).repeat(3, 1)
    logits[1] = logits[1].flip(0)
    logits[2] = torch.tensor([0.5, 0.4, 0.3, 0.2, 0.1, 0.0])
    drafts = [1, 4]
    num = 20000
    params = SamplingParams(temperature=1.0, top_k=top_k)
    requests = [_request(params, drafts)] * num
    appended = _appended(verify_drafts(logits.repeat(num, 1).to(device), requests, [drafts] * num))
    counts = Counter(tuple(tokens) for tokens in appended)
    p = [_probs(row, top_k or VOCAB) for row in logits]
    expected = {(x,): p[0][x] for x in range(VOCAB) if x != drafts[0]}
    expected |= {(drafts[0], x): p[0][drafts[0]] * p[1][x] for x in range(VOCAB) if x != drafts[1]}
    expected |= {
        tuple(drafts) + (x,): p[0][drafts[0]] * p[1][drafts[1]] * p[2][x] for x in range(VOCAB)
    }
    assert set(counts) <= {seq for seq, q in expected.items() if q > 0}
    cells = [seq for seq, q in expected.items() if q * num >= 5]
    statistic = sum(
        (counts[seq] - q * num) ** 2 / (q * num) for seq in cells for q in [expected[seq]]
    )
    assert len(cells) >= 8
    assert statistic < _chi2_critical(len(cells) - 1), (statistic, len(cells))


def _chi2_critical(dof: int) -> float:
    """The upper 0.001 quantile of chi-square (Wilson-Hilferty's approximation)."""
    z = 3.0902
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def test_a_seeded_request_appends_the_same_whatever_its_companions():
    torch.manual_seed(1)
    own = [2, 3]
    logits = torch.randn(3, VOCAB) * 0.3  # nearly flat: acceptance and rejection both happen

    def alone(seed: int) -> list[int]:
        seeded = _request(SamplingParams(temperature=1.0, seed=seed), own)
        return _appended(verify_drafts(logits, [seeded], [own]))[0]

    assert len({tuple(alone(seed)) for seed in range(20)}) > 3  # the seed decides
    for seed, width, greedy in itertools.product(range(10), (1, 4), (False, True)):
        other = [5] * width
        companion = _request(SamplingParams(temperature=0 if greedy else 0.8), other, 1)
        seeded = _request(SamplingParams(temperature=1.0, seed=seed), own)
        rows = torch.cat([torch.randn(width + 1, VOCAB), logits])
        appended = _appended(verify_drafts(rows, [companion, seeded], [other, own]))
        assert appended[1] == alone(seed)


def test_a_step_with_drafts_is_verified_on_the_device_in_one_call(make_tiny_engine, run_engine):
    """With async output the host goes on while a drafted step runs: its launch queues the forward
    and the verification of every drafted request, whose rows of tokens (-1 after each one's last)
    are read at collect, equal to decoding without speculation."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 7, [12] * 20]
    plain = run_engine(make_tiny_engine(async_output=True), prompts, params)
    engine = make_tiny_engine(
        async_output=True, speculative="ngram", plugins=["fcfs", "ngram"], num_speculative_tokens=3
    )
    launch, drafted_launches = engine.runner.launch, []

    def launched(out, block_tables, after=None):
        step = launch(out, block_tables, after)
        if any(s.num_spec_tokens for s in out.scheduled):
            drafted_launches.append(step.token_ids.dim() == 2)
        return step

    engine.runner.launch = launched
    drafted = run_engine(engine, prompts, params)
    assert [o.outputs[0].token_ids for o in drafted] == [o.outputs[0].token_ids for o in plain]
    assert len(drafted_launches) >= 4 and all(drafted_launches)
