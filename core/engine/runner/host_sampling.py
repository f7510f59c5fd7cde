"""Sampling that needs the host: drafts to verify (with their grammar masks), logprobs, and the
plain rows beside them; and the logit adjustments every sampled row gets."""

import time

import torch

from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.penalty_counts import PenaltyCounts, PendingTokens
from spyglass.core.engine.runner.sampler import adjust_logits, sample
from spyglass.core.engine.runner.spec_verify import verify_drafts
from spyglass.core.engine.sched.scheduler import SchedulerOutput
from spyglass.core.engine.token_constraint import TokenConstraint, bitmask_words, fill_rows


def sample_on_host(
    out: SchedulerOutput,
    sampled_rows: tuple[bool, ...],
    logits: torch.Tensor,
    penalties: PenaltyCounts,
    pending: PendingTokens | None = None,
) -> tuple[tuple[list[int], ...], tuple[list[Logprob | None], ...], float]:
    """Per scheduled request: sampled tokens (drafts verified first) and their logprobs; mask
    seconds. Penalties come from the engine's ``penalties``, counting the ``pending`` tokens."""
    plain_rows, plain_requests, spans = [], [], []
    row = 0
    for scheduled, is_sampled in zip(out.scheduled, sampled_rows):
        num_rows = scheduled.num_spec_tokens + 1 if is_sampled else 0
        if num_rows == 1:
            plain_rows.append(row)
            plain_requests.append(scheduled.request)
        spans.append((row, num_rows))
        row += num_rows
    # Every row plain (no drafts) is the common case: sample the logits as they are, without a copy.
    plain_logits = logits if len(plain_rows) == logits.shape[0] else logits[plain_rows]
    plain_tokens, plain_logprobs, mask_time = (
        _sample_plain(plain_logits, plain_requests, penalties, pending)
        if plain_requests
        else ([], [], 0.0)
    )
    plain = {r: (t, lp) for r, t, lp in zip(plain_rows, plain_tokens, plain_logprobs)}
    tokens, logprobs = [], []
    for scheduled, (first, num_rows) in zip(out.scheduled, spans):
        if num_rows == 0:
            tokens.append([])
            logprobs.append([])
        elif num_rows == 1:
            tokens.append([plain[first][0]])
            logprobs.append([plain[first][1]])
        else:
            request = scheduled.request
            drafts = request.spec_token_ids[: scheduled.num_spec_tokens]
            rows = logits[first : first + num_rows]
            mask_start = time.perf_counter()
            bitmask = (
                _draft_bitmask(request.constraint, drafts, logits.shape[-1])
                if request.constraint
                else None
            )
            mask_time += time.perf_counter() - mask_start
            rows = adjust_logits(
                rows,
                [request] * num_rows,
                bitmask,
                range(num_rows),
                drafted=[drafts[:i] for i in range(num_rows)],
            )
            verified = verify_drafts(rows, request, drafts)
            tokens.append(verified)
            logprobs.append([None] * len(verified))
    return tuple(tokens), tuple(logprobs), mask_time


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
):
    """`sample` after `adjust_plain`; mask seconds."""
    adjusted, mask_time = adjust_plain(logits, requests, pending)
    return (*sample(adjusted, requests, penalties, raw=logits, pending=pending), mask_time)


def _draft_bitmask(constraint: TokenConstraint, drafts: list[int], vocab_size: int) -> torch.Tensor:
    """Masks for the positions after each prefix of ``drafts``: tentatively accepted, then rolled back."""
    bitmask = torch.full((len(drafts) + 1, bitmask_words(vocab_size)), -1, dtype=torch.int32)
    for position, draft in enumerate(drafts):
        constraint.fill_bitmask(bitmask, position)
        constraint.accept(draft)  # the engine trimmed drafts to what the grammar allows
    constraint.fill_bitmask(bitmask, len(drafts))
    constraint.rollback(len(drafts))
    return bitmask
