"""A step's sampled rows made tokens on the logits' device: each row's logit adjustments (bias,
allowed and banned tokens, grammar masks), then penalties and the draw for the rows without
drafts, and the verification of the drafted ones. Nothing is read back: on a GPU the host can go
on while the step runs."""

import time
from dataclasses import dataclass, replace
from itertools import accumulate

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.logprob_rows import LogprobRows, logprob_rows
from spyglass.core.engine.runner.penalty_counts import PenaltyCounts, PendingTokens
from spyglass.core.engine.runner.row_tensors import per_row
from spyglass.core.engine.runner.sampler import adjust_logits, sample_tokens
from spyglass.core.engine.runner.spec_verify import verify_drafts
from spyglass.core.engine.sched.scheduler import ScheduledRequest
from spyglass.core.engine.token_constraint import TokenConstraint, bitmask_words, fill_rows


@dataclass(frozen=True, slots=True)
class SampledTokens:
    """A step's tokens on the device, and the logprobs asked for."""

    token_ids: torch.Tensor
    """One id per sampled request; in a step with drafts, a row per sampled request of the tokens
    it appends (-1 after its last)."""
    logprobs: LogprobRows | None
    """By sampled request (a drafted request never asks)."""
    mask_time: float
    """The seconds spent filling grammar masks."""


def sample_step(
    logits: torch.Tensor,
    sampled: list[ScheduledRequest],
    penalties: PenaltyCounts,
    pending: PendingTokens | None = None,
) -> SampledTokens:
    """The tokens of the ``sampled`` requests from their rows of ``logits`` (one each, and one
    more per draft to verify), penalties from the engine's ``penalties`` counting the ``pending``
    tokens of the step in flight. Logprobs are those of the raw logits, as vLLM reports them."""
    if not any(s.num_spec_tokens for s in sampled):
        return _sample_plain(logits, [s.request for s in sampled], penalties, pending)
    device = logits.device
    spans = [s.num_spec_tokens + 1 for s in sampled]
    firsts = list(accumulate(spans[:-1], initial=0))
    token_ids = torch.full((len(sampled), max(spans)), -1, dtype=torch.long, device=device)
    plain = [at for at, s in enumerate(sampled) if not s.num_spec_tokens]
    logprobs, mask_time = None, 0.0
    if plain:
        rows = per_row([firsts[at] for at in plain], torch.long, device)
        part = _sample_plain(
            logits[rows], [sampled[at].request for at in plain], penalties, pending
        )
        token_ids[per_row(plain, torch.long, device), 0] = part.token_ids
        if part.logprobs is not None:
            logprobs = replace(part.logprobs, rows=[plain[row] for row in part.logprobs.rows])
        mask_time = part.mask_time
    drafted = [at for at, s in enumerate(sampled) if s.num_spec_tokens]
    rows = [firsts[at] + i for at in drafted for i in range(spans[at])]
    verified, drafted_mask_time = _verify(
        logits[per_row(rows, torch.long, device)], sampled, drafted
    )
    token_ids[per_row(drafted, torch.long, device), : verified.shape[1]] = verified
    return SampledTokens(token_ids, logprobs, mask_time + drafted_mask_time)


def adjust_plain(
    logits: torch.Tensor, requests: list[Request], pending: PendingTokens | None = None
) -> tuple[torch.Tensor, float]:
    """Each row's logit bias, grammar mask (the batch's masks filled in one call) and bans (after
    the ``pending`` tokens); mask seconds."""
    # A request the commit before a deferred sampling finished keeps its row, unmasked.
    constrained = [
        row
        for row, request in enumerate(requests)
        if request.constraint is not None and not request.is_finished
    ]
    start = time.perf_counter()
    bitmask = (
        fill_rows([requests[row].constraint for row in constrained], logits.shape[-1])
        if constrained
        else None
    )
    mask_time = time.perf_counter() - start if constrained else 0.0
    return adjust_logits(logits, requests, bitmask, constrained, pending=pending), mask_time


def _sample_plain(
    logits: torch.Tensor,
    requests: list[Request],
    penalties: PenaltyCounts,
    pending: PendingTokens | None,
) -> SampledTokens:
    """One token per row: `adjust_plain`, then `sample_tokens`."""
    if not requests:
        return SampledTokens(logits.new_empty(0, dtype=torch.long), None, 0.0)
    adjusted, mask_time = adjust_plain(logits, requests, pending)
    token_ids = sample_tokens(adjusted, requests, penalties, pending)
    return SampledTokens(token_ids, logprob_rows(logits, token_ids, requests), mask_time)


def _verify(
    logits: torch.Tensor, sampled: list[ScheduledRequest], drafted: list[int]
) -> tuple[torch.Tensor, float]:
    """`verify_drafts` of the ``drafted`` requests of ``sampled`` (``logits``: their rows in
    turn), each position adjusted after the drafts before it and masked by its grammar there;
    mask seconds."""
    requests = [sampled[at].request for at in drafted]
    drafts = [r.spec_token_ids[: sampled[at].num_spec_tokens] for r, at in zip(requests, drafted)]
    row_requests = [r for r, d in zip(requests, drafts) for _ in range(len(d) + 1)]
    prefixes = [d[:i] for d in drafts for i in range(len(d) + 1)]
    masks, masked_rows, row = [], [], 0
    start = time.perf_counter()
    for request, own in zip(requests, drafts):
        if request.constraint is not None:
            masks.append(_draft_bitmask(request.constraint, own, logits.shape[-1]))
            masked_rows += range(row, row + len(own) + 1)
        row += len(own) + 1
    mask_time = time.perf_counter() - start if masks else 0.0
    bitmask = torch.cat(masks) if masks else None
    adjusted = adjust_logits(logits, row_requests, bitmask, masked_rows, drafted=prefixes)
    return verify_drafts(adjusted, requests, drafts), mask_time


def _draft_bitmask(constraint: TokenConstraint, drafts: list[int], vocab_size: int) -> torch.Tensor:
    """Masks for the positions after each prefix of ``drafts``: tentatively accepted, then rolled back."""
    bitmask = torch.full((len(drafts) + 1, bitmask_words(vocab_size)), -1, dtype=torch.int32)
    for position, draft in enumerate(drafts):
        constraint.fill_bitmask(bitmask, position)
        constraint.accept(draft)  # the engine trimmed drafts to what the grammar allows
    constraint.fill_bitmask(bitmask, len(drafts))
    constraint.rollback(len(drafts))
    return bitmask
