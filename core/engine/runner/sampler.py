"""Turning a batch of logits into tokens: allowed and banned tokens, logit bias, grammar masks,
penalties, temperature, top-k/top-p/min-p, seeds."""

from collections.abc import Sequence

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.penalty_counts import PenaltyCounts, PendingTokens
from spyglass.core.engine.runner.row_tensors import argmax_rows, per_row
from spyglass.core.engine.runner.token_bans import banned_tokens, mask_banned
from spyglass.core.engine.runner.token_draw import draw
from spyglass.core.engine.token_constraint import allowed_tokens


def adjust_logits(
    logits: torch.Tensor,
    requests: Sequence[Request],
    bitmask: torch.Tensor | None = None,
    masked_rows: Sequence[int] = (),
    drafted: Sequence[Sequence[int]] | None = None,
    pending: PendingTokens | None = None,
) -> torch.Tensor:
    """Each row limited to its ``allowed_token_ids``, its ``logit_bias`` added, ``bitmask`` row
    ``i`` applied to row ``masked_rows[i]``, then its banned tokens (`banned_tokens`, after the
    ``pending`` token of the step in flight, or ``drafted[row]`` for verification rows) masked
    unless nothing else is left (`mask_banned`).

    Returns a new tensor when anything applies and ``logits`` itself otherwise (the raw logits
    stay untouched for logprobs). Disallowed tokens get -inf.
    """
    biased, allowed, banned = [], [], []
    for row, request in enumerate(requests):
        if not request.adjusts_logits:
            continue
        params = request.sampling_params
        if params.logit_bias:
            biased.append((row, params.logit_bias))
        if params.allowed_token_ids is not None:
            allowed.append((row, params.allowed_token_ids))
        if bans := banned_tokens(request, drafted[row] if drafted else ()):
            banned.append((row, request, bans))
    if not (biased or allowed or banned) and bitmask is None:
        return logits
    logits = logits.clone()
    device = logits.device
    # Ids and values reach a GPU through pinned memory, and nothing is read back: the host can
    # prepare the next step while this one runs.
    for row, ids in allowed:
        keep = per_row(list(ids), torch.long, device)
        values = logits[row, keep]
        logits[row] = float("-inf")
        logits[row, keep] = values
    for row, bias in biased:
        ids = per_row(list(bias), torch.long, device)
        logits[row, ids] += per_row(list(bias.values()), logits.dtype, device)
    if bitmask is not None:
        rows = per_row(list(masked_rows), torch.long, device)
        allowed_by_grammar = allowed_tokens(bitmask, logits.shape[-1]).to(device)
        logits[rows] = logits[rows].masked_fill(~allowed_by_grammar, float("-inf"))
    if banned:
        mask_banned(logits, banned, pending)
    return logits


def sample_tokens(
    logits: torch.Tensor,
    requests: list[Request],
    penalties: PenaltyCounts,
    pending: PendingTokens | None = None,
) -> torch.Tensor:
    """One token id per row of float32 ``logits`` (row i belongs to ``requests[i]``), left on the
    logits' device: penalties (from the engine's ``penalties``, the ``pending`` tokens of the step
    in flight counted), then greedy rows' argmax and the others' draws."""
    if any(r.sampling_params.has_penalties for r in requests):
        logits = logits.clone()
        penalties.apply(logits, requests, pending)
    greedy = [r.sampling_params.greedy for r in requests]
    if all(greedy):
        return argmax_rows(logits)
    if not any(greedy):
        return draw(logits, requests)
    token_ids = argmax_rows(logits).to(logits.device)
    drawn = [row for row, is_greedy in enumerate(greedy) if not is_greedy]
    where = per_row(drawn, torch.long, logits.device)
    token_ids[where] = draw(logits[where], [requests[row] for row in drawn])
    return token_ids
