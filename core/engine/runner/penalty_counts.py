"""Presence, frequency and repetition penalties from token histories kept from step to step.

Built anew at each step, a request's penalties cost a tensor of its whole prompt and output, a sort
of it and a few launches of its own (at 4,000 tokens, 0.6 ms a request a step on a 2-core Xeon; on
a GPU each list is a synchronous copy). Here each request with penalties keeps its distinct tokens
(prompt and output, for repetition) and its output's distinct tokens with their counts (frequency
and presence) in numpy arrays that a step extends by the tokens gained since the one before. A step
then penalises all its requests at once: one gather and one scatter of the logits over their
distinct tokens, whatever the batch, and never a pass over the whole vocabulary (on a CPU a pass
over 16 rows of 49,152 logits costs about 0.4 ms).

With async scheduling a step is sampled before the previous step's token is on the host: that
token (`PendingTokens`) is counted on the device, from its id there, after the histories' pass.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.row_tensors import on_device, per_row

_SORTED_FILL = 64
"""A first fill of more tokens than this (a prompt) is counted by a sort."""


@dataclass(slots=True)
class TokenHistory:
    """Distinct token ids, each with how often it occurred."""

    ids: np.ndarray = field(default_factory=lambda: np.empty(16, np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.empty(16, np.float32))
    position: dict[int, int] = field(default_factory=dict)
    size: int = 0

    def add(self, token_ids: list[int]) -> None:
        """Count ``token_ids``."""
        if self.size == 0 and len(token_ids) > _SORTED_FILL:
            # A prompt: counted by one sort, not a Python step per token.
            ids, counts = np.unique(np.asarray(token_ids, np.int64), return_counts=True)
            self.ids, self.counts, self.size = ids, counts.astype(np.float32), len(ids)
            self.position = dict(zip(ids.tolist(), range(self.size)))
            return
        for token_id in token_ids:
            at = self.position.get(token_id)
            if at is not None:
                self.counts[at] += 1
                continue
            if self.size == len(self.ids):
                self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                self.counts = np.concatenate([self.counts, np.empty_like(self.counts)])
            self.position[token_id] = self.size
            self.ids[self.size] = token_id
            self.counts[self.size] = 1
            self.size += 1


@dataclass(frozen=True, slots=True)
class PendingTokens:
    """The tokens that requests sampled in the step still in flight, whose ids only the device
    knows: ``ids`` (on the device) are that step's sampled ids, ``index`` the position in them of
    each of its requests' token, by request id."""

    ids: torch.Tensor
    index: dict[str, int]


@dataclass(slots=True)
class _Histories:
    """A request's histories, and how many of its output tokens they hold."""

    request: Request
    seen: TokenHistory | None
    """Prompt and output, for a repetition penalty."""
    output: TokenHistory | None
    """Output only, for frequency and presence penalties."""
    num_counted: int = 0


class PenaltyCounts:
    """Per live request with penalties, its token histories; a finished request's are let go."""

    def __init__(self):
        self._histories: dict[str, _Histories] = {}

    @property
    def num_requests(self) -> int:
        """Requests whose histories are kept (finished ones until the next step with penalties)."""
        return len(self._histories)

    def apply(
        self, logits: torch.Tensor, requests: list[Request], pending: PendingTokens | None = None
    ) -> None:
        """Penalise row ``i`` of ``logits`` as ``requests[i]`` asks, in place: repetition (a seen
        token's logit divided by the penalty when positive, multiplied when not), then frequency
        and presence (the output's count of a token times the one, and the other once it occurs).
        The output counts the ``pending`` tokens too."""
        rows = [row for row, r in enumerate(requests) if r.sampling_params.has_penalties]
        if not rows:
            return
        self._let_go_finished()
        repeated, counted = [], []
        for row in rows:
            params = requests[row].sampling_params
            histories = self._histories_of(requests[row])
            if histories.seen is not None:
                repeated.append((row, histories.seen, params.repetition_penalty, 0.0))
            if histories.output is not None:
                counted.append(
                    (row, histories.output, params.frequency_penalty, params.presence_penalty)
                )
        tokens = at_pending = None
        if pending is not None:
            at_pending = [pending.index.get(r.req_id, -1) for r in requests]
            if any(at_pending[row] >= 0 for row in rows):
                tokens = _pending_of_rows(pending.ids, at_pending, logits.device)
        seen = output = None
        if repeated:
            at, values, penalty, _ = _scattered(repeated, logits)
            logits[at] = torch.where(values > 0, values / penalty, values * penalty)
            if tokens is not None:
                seen = _rows_holding(tokens, at)
        if counted:
            at, values, frequency, presence = _scattered(counted, logits)
            counts = on_device(
                torch.from_numpy(
                    np.concatenate([history.counts[: history.size] for _, history, _, _ in counted])
                ),
                logits.device,
            ).to(logits.dtype)
            logits[at] = values - frequency * counts - presence
            if tokens is not None:
                output = _rows_holding(tokens, at)
        if tokens is not None:
            _count_pending(logits, requests, rows, at_pending, tokens, seen, output)

    def _histories_of(self, request: Request) -> _Histories:
        """The request's histories, with the output tokens it gained since the last step."""
        histories = self._histories.get(request.req_id)
        if histories is None:
            params = request.sampling_params
            seen = TokenHistory() if params.repetition_penalty != 1 else None
            output = TokenHistory() if params.frequency_penalty or params.presence_penalty else None
            histories = self._histories[request.req_id] = _Histories(request, seen, output)
            if seen is not None:
                seen.add(request.prompt_token_ids)
        new_ids = request.output_token_ids[histories.num_counted :]
        for history in (histories.seen, histories.output):
            if history is not None:
                history.add(new_ids)
        histories.num_counted += len(new_ids)
        return histories

    def _let_go_finished(self) -> None:
        for req_id in [i for i, h in self._histories.items() if h.request.is_finished]:
            del self._histories[req_id]


def _scattered(
    parts: list[tuple[int, TokenHistory, float, float]], logits: torch.Tensor
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each ``(row, history, a, b)``: the logits' index of the row's distinct tokens, their
    values, and ``a`` and ``b`` repeated along them (each row appears once: no index twice)."""
    sizes = [history.size for _, history, _, _ in parts]
    rows = np.repeat([row for row, _, _, _ in parts], sizes)
    ids = np.concatenate([history.ids[: history.size] for _, history, _, _ in parts])
    a = np.repeat(np.array([a for _, _, a, _ in parts], np.float32), sizes)
    b = np.repeat(np.array([b for _, _, _, b in parts], np.float32), sizes)
    device = logits.device
    at = (on_device(torch.from_numpy(rows), device), on_device(torch.from_numpy(ids), device))
    return (
        at,
        logits[at],
        on_device(torch.from_numpy(a), device).to(logits.dtype),
        on_device(torch.from_numpy(b), device).to(logits.dtype),
    )


def _pending_of_rows(ids: torch.Tensor, at: list[int], device: torch.device) -> torch.Tensor:
    """Each row's pending token id (``ids[at[row]]``) on the device, -1 for a row with none."""
    where = per_row(at, torch.long, device)
    return torch.where(where >= 0, ids[where.clamp(min=0)], -1)


def _rows_holding(tokens: torch.Tensor, at: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Whether each row's pending token is among the history tokens at ``at`` (rows, token ids)."""
    rows, ids = at
    hits = (ids == tokens[rows]).to(torch.int32)
    counts = torch.zeros(len(tokens), dtype=torch.int32, device=tokens.device)
    return counts.index_add_(0, rows, hits) > 0


def _count_pending(
    logits: torch.Tensor,
    requests: list[Request],
    rows: list[int],
    at_pending: list[int],
    tokens: torch.Tensor,
    seen: torch.Tensor | None,
    output: torch.Tensor | None,
) -> None:
    """What each row's pending token adds to the histories' penalties, applied to its logit after
    them (the order stays repetition, then frequency and presence): a token new to the seen
    history is repeated now; in the output it occurs once more, for the first time if new there."""
    rows = [row for row in rows if at_pending[row] >= 0]
    params = [requests[row].sampling_params for row in rows]
    device = logits.device
    where = per_row(rows, torch.long, device)
    token = tokens[where]
    values = logits[where, token]
    penalty = per_row([p.repetition_penalty for p in params], logits.dtype, device)
    frequency = per_row([p.frequency_penalty for p in params], logits.dtype, device)
    presence = per_row([p.presence_penalty for p in params], logits.dtype, device)
    if seen is not None:
        repeated = torch.where(values > 0, values / penalty, values * penalty)
        values = torch.where(seen[where], values, repeated)
    if output is not None:
        presence = torch.where(output[where], 0.0, presence)
    logits[where, token] = values - frequency - presence
