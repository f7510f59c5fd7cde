"""Verifying draft tokens against the target model: the rule that keeps the output distribution unchanged.

Drafts are point proposals (a proposer's distribution q is one-hot on its draft), so standard
speculative sampling reduces to: accept draft d at position i with probability p_i(d); on the first
rejection, sample from p_i with d removed and renormalised; if all are accepted, sample a bonus
token from the last position. Greedy requests accept the longest prefix equal to the argmax.

A step's drafted requests are verified together on the logits' device, and nothing is read back:
on a GPU the host goes on while the step runs (async output), as it does for a step without drafts.
A seeded request draws one uniform per draft of its own and then its race's noise from its own
generator, so its tokens do not depend on its companions in the batch.
"""

from dataclasses import dataclass
from itertools import accumulate

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.row_tensors import argmax_rows, on_device, per_row
from spyglass.core.engine.runner.token_draw import noise, target_probs, uniform


@dataclass(frozen=True, slots=True)
class _Drafted:
    """Some drafted requests, padded to the most drafts: ``rows[i, j]`` is request i's logits row at
    position j (its last past its drafts), ``drafts[i, j]`` its draft j (0 past them), and
    ``is_draft[i, j]`` whether it has one there."""

    requests: list[Request]
    counts: list[int]
    rows: torch.Tensor
    drafts: torch.Tensor
    is_draft: torch.Tensor


def verify_drafts(
    logits: torch.Tensor,
    requests: list[Request],
    drafts: list[list[int]],
    firsts: list[int] | None = None,
) -> torch.Tensor:
    """The tokens each request appends, as a ``[requests, 1 + most drafts]`` tensor on the logits'
    device: its accepted drafts, then one token of the target model, then -1s.

    Request ``i``'s ``len(drafts[i]) + 1`` float32 rows of ``logits`` (every request has a draft)
    start at row ``firsts[i]`` (default: each request's rows follow the one before's): position
    ``j`` scores the token after draft ``j - 1``.
    """
    device = logits.device
    counts = [len(d) for d in drafts]
    width = max(counts)
    positions = torch.arange(width + 1)
    if firsts is None:
        firsts = list(accumulate((c + 1 for c in counts[:-1]), initial=0))
    last = torch.tensor(counts).unsqueeze(1)
    rows = torch.tensor(firsts).unsqueeze(1) + torch.minimum(positions, last)
    padded = torch.tensor([d + [0] * (width - len(d)) for d in drafts], dtype=torch.long)
    is_draft = positions[:width] < last
    token_ids = torch.full((len(requests), width + 1), -1, dtype=torch.long, device=device)
    for greedy in (True, False):
        group = [at for at, r in enumerate(requests) if r.sampling_params.greedy == greedy]
        if not group:
            continue
        whole = len(group) == len(requests)
        part = _Drafted(
            [requests[at] for at in group],
            [counts[at] for at in group],
            *(on_device(t if whole else t[group], device) for t in (rows, padded, is_draft)),
        )
        accepted, final = _greedy(logits, part) if greedy else _sampled(logits, part)
        kept = torch.arange(width, device=device) < accepted.unsqueeze(1)
        appended = torch.full((len(group), width + 1), -1, dtype=torch.long, device=device)
        appended[:, :width] = torch.where(kept, part.drafts, -1)
        appended.scatter_(1, accepted.unsqueeze(1), final.unsqueeze(1))
        if whole:
            return appended
        token_ids[per_row(group, torch.long, device)] = appended
    return token_ids


def _num_accepted(accepts: torch.Tensor) -> torch.Tensor:
    """How many leading positions of each row of the bool ``accepts`` are True."""
    return accepts.long().cumprod(dim=1).sum(dim=1)


def _greedy(logits: torch.Tensor, part: _Drafted) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts accepted while they equal the argmax; then the argmax after the last accepted."""
    targets = argmax_rows(logits).to(logits.device)[part.rows]
    accepted = _num_accepted((part.drafts == targets[:, :-1]) & part.is_draft)
    return accepted, targets.gather(1, accepted.unsqueeze(1)).squeeze(1)


def _sampled(logits: torch.Tensor, part: _Drafted) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts accepted while a uniform falls under their probability; then a draw from the position
    after the last accepted, without the draft rejected there."""
    device = logits.device
    num, width = part.drafts.shape
    positions = [r for r in part.requests for _ in range(width + 1)]
    probs = target_probs(logits[part.rows.flatten()], positions).view(num, width + 1, -1)
    draft_probs = probs[:, :-1].gather(2, part.drafts.unsqueeze(2)).squeeze(2)
    uniforms = uniform(part.requests, width, device, part.counts)
    accepted = _num_accepted((uniforms < draft_probs) & part.is_draft)
    final = probs[torch.arange(num, device=device), accepted]
    rejected = accepted < part.is_draft.sum(dim=1)
    draft = part.drafts.gather(1, accepted.clamp(max=width - 1).unsqueeze(1))
    final.scatter_(1, draft, torch.where(rejected.unsqueeze(1), 0.0, final.gather(1, draft)))
    winners = argmax_rows(final / noise(part.requests, final.shape[1], device))
    return accepted, winners.to(device)
