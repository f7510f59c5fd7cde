"""The token draw on a vocabulary wide enough for every path it takes: rows decided among their top
256 ranked tokens, among 4,096, sorted whole, and drawn as a mixture of the ranked tokens and the
rest. Checked against filters computed here from their definitions, by a full sort in float64.
``WIDTHS = ()`` runs the GPU's way (plain rows race the whole vocabulary, filtered rows are sorted
whole) on the CPU; on a GPU the same tests run there too."""

from collections import Counter

import pytest
import torch
from scipy.stats import chi2

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner import token_draw
from spyglass.core.engine.runner.penalty_counts import PenaltyCounts
from spyglass.core.engine.runner.sampler import sample_tokens
from spyglass.core.engine.runner.token_draw import draw, target_probs
from spyglass.core.engine.sampling_params import SamplingParams
from tests.core.conftest import ON_CUDA

VOCAB = 6000


def wide_logits(seed: int = 0) -> torch.Tensor:
    """Ten likely tokens holding about 70% of the mass, then a tail of distinct small logits holding
    the rest, so that top-p's nucleus, min-p's floor and the mixture's tail reach past 256 and 4,096
    ranked tokens."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(VOCAB, generator=generator) * 0.5
    head = torch.randperm(VOCAB, generator=generator)[:10]
    logits[head] = torch.linspace(9.0, 6.0, 10)
    return logits


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The filtered distribution by the definitions: softmax at the temperature, then keep the
    tokens ranked under top_k, those whose higher-ranked mass is under top_p and those at least
    min_p times the most likely one's probability (the most likely always)."""
    probs = (logits.double() / params.temperature).softmax(dim=-1)
    ordered, order = probs.sort(descending=True)
    ranks = torch.arange(len(ordered))
    keep = (ordered.cumsum(0) - ordered < params.top_p) & (ordered >= params.min_p * ordered[0])
    if params.top_k > 0:
        keep &= ranks < params.top_k
    keep[0] = True
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = ordered[keep]
    return filtered / filtered.sum()


CASES = {
    "temperature": SamplingParams(temperature=1.0),
    "cool": SamplingParams(temperature=0.7),
    "top_p inside 256": SamplingParams(top_p=0.5),
    "top_p past 256": SamplingParams(top_p=0.85),
    "top_p past 4096": SamplingParams(top_p=0.99),
    "top_k inside 256": SamplingParams(top_k=40),
    "top_k past 256": SamplingParams(top_k=1000),
    "top_k past 4096": SamplingParams(top_k=5000),
    "min_p": SamplingParams(min_p=1e-4),
    "all three": SamplingParams(temperature=1.3, top_k=3000, top_p=0.9, min_p=1e-5),
}


def requests_for(params: SamplingParams, count: int) -> list[Request]:
    return [Request(str(i), [1], params) for i in range(count)]


@pytest.fixture(params=["ranked", "whole", ON_CUDA])
def device(request, monkeypatch) -> torch.device:
    """Where the draw runs: the CPU with its rankings, the CPU the GPU's way (``WIDTHS = ()``),
    or a GPU."""
    if request.param == "whole":
        monkeypatch.setattr(token_draw, "WIDTHS", ())
    return torch.device("cuda" if request.param == "cuda" else "cpu")


@pytest.mark.parametrize("params", CASES.values(), ids=CASES.keys())
def test_the_distribution_is_the_filters_by_their_definitions(params, device):
    logits = torch.stack([wide_logits(seed) for seed in range(3)])
    probs = target_probs(logits.to(device), requests_for(params, 3)).cpu()
    for row in range(3):
        expected = reference_probs(logits[row], params).float()
        assert torch.equal(probs[row] > 0, expected > 0)
        torch.testing.assert_close(probs[row], expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("params", CASES.values(), ids=CASES.keys())
def test_draws_follow_the_filtered_distribution(params, device):
    num_draws = 3000
    logits = wide_logits()
    expected = reference_probs(logits, params)
    torch.manual_seed(0)
    rows = logits.expand(num_draws, -1).contiguous().to(device)
    tokens = draw(rows, requests_for(params, num_draws)).cpu()
    counts = Counter(tokens.tolist())
    assert all(expected[token] > 0 for token in counts)  # nothing a filter drops
    # Chi-square over the tokens expected at least 20 times each, and the rest as one bin.
    common = (expected * num_draws >= 20).nonzero().flatten().tolist()
    observed = [counts[t] for t in common] + [num_draws - sum(counts[t] for t in common)]
    means = [float(expected[t]) * num_draws for t in common]
    means.append(num_draws - sum(means))
    bins = [(o, m) for o, m in zip(observed, means) if m > 0]
    statistic = sum((o - m) ** 2 / m for o, m in bins)
    assert statistic < chi2.ppf(1 - 1e-4, len(bins) - 1), (observed, means)


def test_the_tail_of_an_unfiltered_row_is_drawn():
    # About 20% of the mass lies past the top 256: the mixture must reach it.
    logits = wide_logits()
    torch.manual_seed(1)
    tokens = draw(logits.expand(2000, -1).contiguous(), requests_for(SamplingParams(), 2000))
    ranked = set(logits.topk(256).indices.tolist())
    past_ranked = sum(token not in ranked for token in tokens.tolist()) / 2000
    expected = 1 - float(logits.softmax(-1)[list(ranked)].sum())
    assert abs(past_ranked - expected) < 0.05


def test_a_seeded_row_draws_the_same_tokens_whatever_its_companions(device):
    logits = torch.stack([wide_logits(seed) for seed in range(4)]).to(device)
    companions = [
        SamplingParams(top_p=0.99),
        SamplingParams(temperature=0),
        SamplingParams(seed=3, min_p=1e-4),
        SamplingParams(top_k=40),
    ]
    for seeded in (SamplingParams(seed=7), SamplingParams(seed=7, top_p=0.99)):
        alone, together = Request("a", [1], seeded), Request("b", [1], seeded)
        others = [Request(str(i), [1], p) for i, p in enumerate(companions)]
        for step in range(12):
            row = step % 4
            [token_alone] = sample_tokens(logits[row : row + 1], [alone], PenaltyCounts()).tolist()
            batch = others[:2] + [together] + others[2:]
            mixed = torch.cat([logits, logits[row : row + 1]])[[0, 1, 4, 2, 3]]
            tokens = sample_tokens(mixed, batch, PenaltyCounts()).tolist()
            assert tokens[2] == token_alone
