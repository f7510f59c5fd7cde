"""The tokens a request may not sample next: its EOS and stop tokens while it is short of
``min_tokens``, and the last token of each bad word whose other tokens it has just generated.

With async scheduling a step is sampled before the previous step's token is on the host: a bad
word whose next-to-last token that pending token may be is banned on the device, where the pending
token's id is compared with it (`TokenBans.if_pending`), and the host never waits for it."""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.penalty_counts import PendingTokens
from spyglass.core.engine.runner.row_tensors import per_row


@dataclass(slots=True)
class TokenBans:
    """One row's banned tokens: ``always``, and the ``if_pending`` pairs (token id, pending id)
    whose token is banned only when the request's pending token is that id."""

    always: list[int] = field(default_factory=list)
    if_pending: list[tuple[int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.always or self.if_pending)


def banned_tokens(request: Request, drafted: Sequence[int] = ()) -> TokenBans:
    """The tokens to mask for ``request``'s next token, after its output, its pending token (if
    any: async scheduling samples before it is on the host) and then ``drafted`` (the drafts before
    a verification row; never with a pending token, speculation does not schedule ahead)."""
    params = request.sampling_params
    bans = TokenBans()
    if not (params.min_tokens or request.bad_word_ids):
        return bans
    num_before = request.num_output_tokens + request.num_pending_tokens + len(drafted)
    if num_before < params.min_tokens:
        bans.always += request.eos_token_ids
        bans.always += params.stop_token_ids
    output = request.output_token_ids
    for word in request.bad_word_ids:
        if len(word) == 1:
            bans.always.append(word[-1])
        elif request.num_pending_tokens:
            if _ends_with(output, (), word[:-2]):
                bans.if_pending.append((word[-1], word[-2]))
        elif _ends_with(output, drafted, word[:-1]):
            bans.always.append(word[-1])
    return bans


def mask_banned(
    logits: torch.Tensor,
    banned: list[tuple[int, Request, TokenBans]],
    pending: PendingTokens | None,
) -> None:
    """Set each ``(row, request, bans)``'s banned logits to -inf in place, all rows at once, unless
    that leaves a row nothing to sample (a grammar or ``allowed_token_ids`` that allow only banned
    tokens: a regex that must end now, under ``min_tokens``); then the row is left as it was. Its
    conditional bans compare ``pending``'s id for ``request`` on the device."""
    rows, token_ids, required, positions = [], [], [], []
    for at, (_, request, bans) in enumerate(banned):
        rows += [at] * (len(bans.always) + len(bans.if_pending))
        token_ids += bans.always
        required += [-1] * len(bans.always)
        positions += [0] * len(bans.always)
        if bans.if_pending:
            position = pending.index[request.req_id]
            for token_id, pending_id in bans.if_pending:
                token_ids.append(token_id)
                required.append(pending_id)
                positions.append(position)
    device = logits.device
    where = per_row([row for row, _, _ in banned], torch.long, device)
    before = logits[where]
    applies = torch.ones(len(token_ids), dtype=torch.uint8, device=device)
    if pending is not None and any(r >= 0 for r in required):
        wanted = per_row(required, torch.long, device)
        matches = pending.ids[per_row(positions, torch.long, device)] == wanted
        applies = (matches | (wanted < 0)).to(torch.uint8)
    # Summed, not assigned: a token two words ban, one only if the pending token matches, is
    # banned when either applies.
    hits = torch.zeros(before.shape, dtype=torch.uint8, device=device)
    hits.index_put_(
        (per_row(rows, torch.long, device), per_row(token_ids, torch.long, device)),
        applies,
        accumulate=True,
    )
    after = before.masked_fill(hits > 0, float("-inf"))
    nothing_left = ~torch.isfinite(after).any(dim=-1, keepdim=True)
    logits[where] = torch.where(nothing_left, before, after)


def _ends_with(output: list[int], drafted: Sequence[int], prefix: Sequence[int]) -> bool:
    """Whether ``output`` then ``drafted`` end with ``prefix`` (copying only their last tokens)."""
    if not prefix:
        return True
    tail = (output[-len(prefix) :] + list(drafted))[-len(prefix) :]
    return tail == list(prefix)
