"""Drawing tokens from temperature-scaled logits under top-k, top-p and min-p.

A row's token wins the exponential race: the argmax of p(v) / q(v) over the tokens its filters
keep, with p the row's distribution and q(v) ~ Exp(1), drawn as -log(u) for u uniform in [0, 1).
A seeded request draws every random number of its row from its own generator, and how many it
draws depends only on its own row, so its tokens do not depend on its companions in the batch.

On the CPU a row is first ranked, its `WIDTHS` most likely tokens in turn, and sorted whole only
when its filters keep more: a full sort of a 49,152-token row costs about 3 ms there, the top 257
0.12 ms. A row that top-p does not cut (temperature alone, top-k under the vocabulary's size,
min-p) is drawn as a mixture: its kept tokens among the top `WIDTHS[0]` with their share of the
kept mass, else one of the others, so most draws race 256 tokens rather than the vocabulary. On a
GPU nothing is chosen by rank, since that would make the host wait for the device: a filtered row
is sorted whole and any other races the whole vocabulary.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.row_tensors import argmax_rows, on_device, per_row
from spyglass.core.engine.sampling_params import SamplingParams

WIDTHS = (256, 4096)
"""How many of a row's most likely tokens are ranked, in turn, before the whole row is sorted."""


@dataclass(frozen=True, slots=True)
class Ranked:
    """Rows' most likely tokens in order: ``token_ids[i]`` holds row ``rows[i]``'s and ``probs[i]``
    their probabilities under the row's whole distribution, 0 where a filter drops the token.
    ``cut_short[i]``: the row's filters keep tokens past the ranked ones."""

    rows: list[int]
    token_ids: torch.Tensor
    probs: torch.Tensor
    cut_short: list[bool]

    def take(self, indices: list[int]) -> "Ranked":
        """The rows at ``indices`` of this ranking (itself for all of them: on a GPU, indexing by a
        list would wait for the device)."""
        if len(indices) == len(self.rows):
            return self
        return Ranked(
            [self.rows[i] for i in indices],
            self.token_ids[indices],
            self.probs[indices],
            [self.cut_short[i] for i in indices],
        )


def is_filtered(params: SamplingParams, vocab_size: int) -> bool:
    """Whether top-k, top-p or min-p can drop any token of a ``vocab_size`` vocabulary."""
    return 0 < params.top_k < vocab_size or params.top_p < 1.0 or params.min_p > 0.0


def scale(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """Each row over its request's temperature (1 for a greedy request)."""
    temperature = per_row(
        [r.sampling_params.temperature if not r.sampling_params.greedy else 1.0 for r in requests],
        torch.float32,
        logits.device,
    )
    return logits / temperature.unsqueeze(1)


def target_probs(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """The distribution each row samples from: temperature, then top-k, top-p and min-p (greedy
    rows at T=1), over the whole vocabulary."""
    scaled = scale(logits, requests)
    probs = scaled.softmax(dim=-1)
    vocab = probs.shape[-1]
    params = [r.sampling_params for r in requests]
    pending = [row for row, p in enumerate(params) if is_filtered(p, vocab)]
    for width in _widths(vocab, logits.device):
        if not pending:
            break
        ranked = _rank(scaled, params, pending, width)
        done = ranked.take([i for i, cut in enumerate(ranked.cut_short) if not cut])
        if done.rows:
            kept = done.probs / done.probs.sum(dim=-1, keepdim=True)
            filtered = torch.zeros(len(done.rows), vocab, device=probs.device)
            probs[per_row(done.rows, torch.long, probs.device)] = filtered.scatter_(
                1, done.token_ids, kept
            )
        pending = [row for row, cut in zip(ranked.rows, ranked.cut_short) if cut]
    return probs


def draw(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """One token id per row of float32 ``logits`` (row i: ``requests[i]``, none of them greedy),
    on the logits' device."""
    device, vocab = logits.device, logits.shape[-1]
    scaled = scale(logits, requests)
    params = [r.sampling_params for r in requests]
    token_ids = torch.empty(len(requests), dtype=torch.long, device=device)
    widths = _widths(vocab, device)
    pending = list(range(len(requests)))
    if len(widths) == 1:  # a GPU: only what needs no choice by rank
        plain = [row for row in pending if not is_filtered(params[row], vocab)]
        _race_vocabulary(scaled, requests, plain, token_ids, exclude=None)
        pending = [row for row in pending if is_filtered(params[row], vocab)]
    for index, width in enumerate(widths):
        if not pending:
            break
        ranked = _rank(scaled, params, pending, width)
        _race_ranked(
            ranked.take([i for i, c in enumerate(ranked.cut_short) if not c]), requests, token_ids
        )
        cut = [i for i, c in enumerate(ranked.cut_short) if c]
        if index == 0 and width < vocab:
            mixed = [i for i in cut if _kept_by_floor(params[ranked.rows[i]], vocab)]
            _draw_mixture(scaled, ranked.take(mixed), requests, token_ids)
            cut = [i for i in cut if not _kept_by_floor(params[ranked.rows[i]], vocab)]
        pending = [ranked.rows[i] for i in cut]
    return token_ids


def _kept_by_floor(params: SamplingParams, vocab_size: int) -> bool:
    """Whether a row keeps every token at or above its min-p floor: no top-p and no top-k that cuts
    the vocabulary (a top-k within the first ranking never leaves a row cut short)."""
    return params.top_p == 1.0 and not 0 < params.top_k < vocab_size


def _widths(vocab_size: int, device: torch.device) -> list[int]:
    """The ranking widths a row goes through, the last its whole vocabulary (only that on a GPU)."""
    if device.type != "cpu":
        return [vocab_size]
    return [width for width in WIDTHS if width + 1 < vocab_size] + [vocab_size]


def _rank(
    scaled: torch.Tensor, params: Sequence[SamplingParams], rows: list[int], width: int
) -> Ranked:
    """``rows``' ``width`` most likely tokens with the filters applied. Short of the whole
    vocabulary, one more token is ranked to tell whether the filters keep any past them."""
    device, vocab = scaled.device, scaled.shape[-1]
    chosen = [params[row] for row in rows]
    values = _rows(scaled, rows)
    total = _log_total(values)
    if width < vocab:
        values, token_ids = values.topk(width + 1, dim=-1)
    else:
        values, token_ids = values.sort(dim=-1, descending=True)
    probs = (values - total).exp()
    top_k = per_row([p.top_k if p.top_k > 0 else vocab for p in chosen], torch.long, device)
    top_p = per_row([p.top_p for p in chosen], torch.float32, device)
    min_p = per_row([p.min_p for p in chosen], torch.float32, device)
    ranks = torch.arange(probs.shape[1], device=device).unsqueeze(0)
    # A token is kept while the probability mass *before* it is under top_p, so the first always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    drop = (ranks >= top_k.unsqueeze(1)) | (mass_before >= top_p.unsqueeze(1))
    drop |= probs < min_p.unsqueeze(1) * probs[:, :1]
    # The most likely token always stays, whatever rounding does to a tiny top_p (the engine thread
    # flushes denormals to zero, so a top_p of 5e-324 compares as 0 there).
    drop[:, 0] = False
    kept = probs.masked_fill(drop, 0.0)
    if width >= vocab:
        return Ranked(rows, token_ids, kept, [False] * len(rows))
    # Down a row ranks and the mass before a token only grow and probabilities only shrink: past a
    # dropped or impossible token, every token is.
    cut_short = (kept[:, -1] > 0).tolist()
    return Ranked(rows, token_ids[:, :-1], kept[:, :-1], cut_short)


def _race_ranked(ranked: Ranked, requests: Sequence[Request], token_ids: torch.Tensor) -> None:
    """Write each ranked row's winner among its kept tokens into ``token_ids``."""
    if not ranked.rows:
        return
    device = token_ids.device
    exp_noise = noise([requests[row] for row in ranked.rows], ranked.probs.shape[1], device)
    winners = argmax_rows(ranked.probs / exp_noise).to(device)
    where = per_row(ranked.rows, torch.long, device)
    token_ids[where] = ranked.token_ids.gather(1, winners.unsqueeze(1)).squeeze(1)


def _race_vocabulary(
    scaled: torch.Tensor,
    requests: Sequence[Request],
    rows: list[int],
    token_ids: torch.Tensor,
    exclude: Ranked | None,
) -> None:
    """Write the winners of ``rows`` raced over their whole vocabulary (tokens under a row's min-p
    floor out, and ``exclude``'s ranked tokens, for these rows in order) into ``token_ids``."""
    if not rows:
        return
    device = token_ids.device
    where = per_row(rows, torch.long, device)
    values = _rows(scaled, rows)
    # Unnormalised: the race's winner is the same for any positive multiple of p.
    weights = (values - values.amax(dim=-1, keepdim=True)).exp_()
    min_p = [requests[row].sampling_params.min_p for row in rows]
    if any(min_p):  # the largest weight is 1: the floor is min_p itself
        weights.masked_fill_(weights < per_row(min_p, torch.float32, device).unsqueeze(1), 0.0)
    if exclude is not None:
        weights.scatter_(1, exclude.token_ids, 0.0)
    exp_noise = noise([requests[row] for row in rows], weights.shape[1], device)
    token_ids[where] = argmax_rows(weights.div_(exp_noise)).to(device)


def _draw_mixture(
    scaled: torch.Tensor, ranked: Ranked, requests: Sequence[Request], token_ids: torch.Tensor
) -> None:
    """Rows whose kept tokens are all those at or above their min-p floor (top-k under the
    ranking's width or none, no top-p), cut short by their ranking: a ranked token with the kept
    share of the ranked ones, else one of the rest."""
    if not ranked.rows:
        return
    device = token_ids.device
    min_p = [requests[row].sampling_params.min_p for row in ranked.rows]
    kept_mass = torch.ones(len(ranked.rows), device=device)  # without min-p, every token
    if any(min_p):
        values = _rows(scaled, ranked.rows)
        probs = (values - _log_total(values)).exp_()
        floor = per_row(min_p, torch.float32, device).unsqueeze(1) * ranked.probs[:, :1]
        kept_mass = probs.masked_fill_(probs < floor, 0.0).sum(dim=-1)
    choice = uniform([requests[row] for row in ranked.rows], 1, device).squeeze(1)
    in_ranked = (choice * kept_mass < ranked.probs.sum(dim=-1)).tolist()
    _race_ranked(ranked.take([i for i, r in enumerate(in_ranked) if r]), requests, token_ids)
    rest = ranked.take([i for i, r in enumerate(in_ranked) if not r])
    _race_vocabulary(scaled, requests, rest.rows, token_ids, exclude=rest)


def _rows(scaled: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``scaled``'s ``rows``: itself when they are all of its rows, in order (no copy)."""
    if rows == list(range(scaled.shape[0])):
        return scaled
    return scaled[per_row(rows, torch.long, scaled.device)]


def _log_total(values: torch.Tensor) -> torch.Tensor:
    """Each row's log of the sum of its exponentials (``logsumexp``, kept as a column), in three
    passes over the row: torch's own takes about three times as long on the CPU."""
    largest = values.amax(dim=-1, keepdim=True)
    return largest + (values - largest).exp_().sum(dim=-1, keepdim=True).log_()


def uniform(
    requests: Sequence[Request],
    width: int,
    device: torch.device,
    counts: Sequence[int] | None = None,
) -> torch.Tensor:
    """Uniform numbers in [0, 1), ``width`` per request: a seeded request's from its generator (its
    first ``counts[i]`` only, when ``counts`` is given: as many as its own row needs), the others'
    from the global one."""
    values = torch.rand((len(requests), width), device=device)
    seeded = [row for row, r in enumerate(requests) if r.generator is not None]
    if seeded:
        own = torch.rand((len(seeded), width))
        for at, row in enumerate(seeded):
            count = width if counts is None else counts[row]
            own[at, :count] = torch.rand(count, generator=requests[row].generator)
        values[per_row(seeded, torch.long, device)] = on_device(own, device)
    return values


def noise(requests: Sequence[Request], width: int, device: torch.device) -> torch.Tensor:
    """Exp(1) noise, ``width`` per request (`uniform`'s, as -log(u): a u of 0 gives an infinite q,
    which never wins)."""
    return uniform(requests, width, device).log_().neg_()
