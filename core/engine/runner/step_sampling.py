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
    requests = [s.request for s in sampled]
    if not any(s.num_spec_tokens for s in sampled):
        return _sample_plain(logits, requests, penalties, pending)
    # Speculation never schedules ahead: no token is pending.
    device = logits.device
    spans = [s.num_spec_tokens + 1 for s in sampled]
    firsts = list(accumulate(spans[:-1], initial=0))
    drafts = [r.spec_token_ids[: span - 1] for r, span in zip(requests, spans)]
    adjusted, mask_time = _adjust_drafted(logits, requests, drafts)
    token_ids = torch.full((len(sampled), max(spans)), -1, dtype=torch.long, device=device)
    plain = [at for at, span in enumerate(spans) if span == 1]
    drafted = [at for at, span in enumerate(spans) if span > 1]
    logprobs = None
    if plain:
        rows = per_row([firsts[at] for at in plain], torch.long, device)
        plain_requests = [requests[at] for at in plain]
        plain_ids = sample_tokens(adjusted[rows], plain_requests, penalties)
        token_ids[per_row(plain, torch.long, device), 0] = plain_ids
        rows_logprobs = logprob_rows(logits[rows], plain_ids, plain_requests)
        if rows_logprobs is not None:
            logprobs = replace(rows_logprobs, rows=[plain[row] for row in rows_logprobs.rows])
    verified = verify_drafts(
        adjusted,
        [requests[at] for at in drafted],
        [drafts[at] for at in drafted],
        [firsts[at] for at in drafted],
    )
    if len(drafted) == len(sampled):
        return SampledTokens(verified, logprobs, mask_time)
    token_ids[per_row(drafted, torch.long, device), : verified.shape[1]] = verified
    return SampledTokens(token_ids, logprobs, mask_time)


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


def _adjust_drafted(
    logits: torch.Tensor, requests: list[Request], drafts: list[list[int]]
) -> tuple[torch.Tensor, float]:
    """`adjust_logits` for a step with drafts (``logits``: each request's rows in turn, one per
    draft and one more), each position after the drafts before it and masked by its grammar
    there; mask seconds."""
    row_requests = [r for r, own in zip(requests, drafts) for _ in range(len(own) + 1)]
    prefixes = [own[:i] for own in drafts for i in range(len(own) + 1)]
    masks, masked_rows, row = [], [], 0
    start = time.perf_counter()
    for request, own in zip(requests, drafts):
        if request.constraint is not None:
            masks.append(_draft_bitmask(request.constraint, own, logits.shape[-1]))
            masked_rows += range(row, row + len(own) + 1)
        row += len(own) + 1
    mask_time = time.perf_counter() - start if masks else 0.0
    bitmask = torch.cat(masks) if masks else None
    return adjust_logits(logits, row_requests, bitmask, masked_rows, drafted=prefixes), mask_time


def _draft_bitmask(constraint: TokenConstraint, drafts: list[int], vocab_size: int) -> torch.Tensor:
    """Masks for the positions after each prefix of ``drafts``: tentatively accepted, then rolled back."""
    bitmask = torch.full((len(drafts) + 1, bitmask_words(vocab_size)), -1, dtype=torch.int32)
    for position, draft in enumerate(drafts):
        constraint.fill_bitmask(bitmask, position)
        constraint.accept(draft)  # the engine trimmed drafts to what the grammar allows
    constraint.fill_bitmask(bitmask, len(drafts))
    constraint.rollback(len(drafts))
    return bitmask
