"""Pooling requests' answers (``SamplingParams.pooling``), from the final norm's output at the
prompt positions each one pools (`Request.pool_range`: the last, the first, or all of them):
the pooled vector itself (an embedding, of unit length where asked) or a sequence classifier's
class probabilities (or raw logits).

A prompt computed in several steps (chunked prefill) is pooled piece by piece: each step sums
the rows it computed, the commit adds the sum to the request (`PoolPart`), and the step that
finishes the prompt answers from the whole sum. A recomputed prompt (after a preemption) skips
the positions already added.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from spyglass.core.engine.sched.scheduler import ScheduledRequest

Pooled = list[float] | None
"""One scheduled request's answer in a step: None unless it pools and the step finished its prompt."""


@dataclass(frozen=True, slots=True)
class PoolSlice:
    """The rows of a step's flattened batch that one pooling request pools, and whether the step
    finishes its prompt (then it answers)."""

    index: int
    """The request's place among the step's scheduled requests."""
    rows: range
    upto: int
    """The prompt position after the last one these rows hold."""
    finishes: bool


@dataclass(frozen=True, slots=True)
class PoolPart:
    """What a step that does not finish a pooling request's prompt adds to it: the sum of the
    final hidden states it computed, up to prompt position ``upto``."""

    hidden_sum: torch.Tensor
    upto: int


def pool_slices(
    scheduled: tuple[ScheduledRequest, ...], sampled_rows: tuple[bool, ...]
) -> list[PoolSlice]:
    """Each pooling request's rows in this step (read before the step is counted in flight:
    a request's first new token is at ``num_launched_tokens``); empty when none pools here."""
    slices, offset = [], 0
    for index, (item, finishes) in enumerate(zip(scheduled, sampled_rows, strict=True)):
        request = item.request
        if request.pool_range is not None:
            first, last = request.pool_range
            start = request.num_launched_tokens
            low = max(start, first, request.pooled_upto)
            high = min(start + item.num_new_tokens, last)
            if high > low or finishes:
                rows = range(offset + low - start, offset + max(high, low) - start)
                slices.append(PoolSlice(index, rows, max(high, low), finishes))
        offset += item.num_new_tokens
    return slices


def pool(
    final_hidden: torch.Tensor,
    slices: list[PoolSlice],
    scheduled: tuple[ScheduledRequest, ...],
    classify: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[tuple[Pooled, ...], tuple[PoolPart | None, ...]]:
    """Per scheduled request, its answer (when the step finishes its prompt) and what the step
    adds to its sum (when it does not); ``final_hidden`` holds the slices' rows in order and
    ``classify`` is the model's classification head."""
    answers: list[Pooled] = [None] * len(scheduled)
    parts: list[PoolPart | None] = [None] * len(scheduled)
    finished, vectors = [], []
    start = 0
    for piece in slices:
        hidden_sum = final_hidden[start : start + len(piece.rows)].float().sum(dim=0)
        start += len(piece.rows)
        if not piece.finishes:
            parts[piece.index] = PoolPart(hidden_sum, piece.upto)
            continue
        request = scheduled[piece.index].request
        if request.pool_sum is not None:
            hidden_sum = hidden_sum + request.pool_sum
        first, last = request.pool_range
        finished.append(piece.index)
        vectors.append(hidden_sum / (last - first))
    if finished:
        for index, answer in zip(
            finished, _answers(torch.stack(vectors), finished, scheduled, classify)
        ):
            answers[index] = answer
    return tuple(answers), tuple(parts)


def _answers(
    vectors: torch.Tensor,
    indices: list[int],
    scheduled: tuple[ScheduledRequest, ...],
    classify: Callable[[torch.Tensor], torch.Tensor],
) -> list[list[float]]:
    """The pooled ``vectors`` (float32, one per finished request at ``indices``) turned into
    answers: embeddings (cut to their ``dimensions``, then of unit length where asked) or class
    probabilities (or logits)."""
    params = [scheduled[index].request.sampling_params.pooling for index in indices]
    answers: list[list[float]] = [[] for _ in indices]
    for k, p in enumerate(params):
        if p.task == "embed":
            # ``dimensions`` (a Matryoshka-trained model's shorter vector): the first ones.
            vector = vectors[k, : p.dimensions]
            if p.normalize:
                vector = torch.nn.functional.normalize(vector, dim=-1)
            answers[k] = vector.tolist()
    sort = [k for k, p in enumerate(params) if p.task == "classify"]
    if sort:
        logits = classify(vectors[sort])
        probs = logits.softmax(dim=-1) if logits.shape[-1] > 1 else logits.sigmoid()
        chosen = _where([params[k].activation for k in sort], probs, logits)
        for k, answer in zip(sort, chosen.tolist()):
            answers[k] = answer
    return answers


def _where(flags: list[bool], if_true: torch.Tensor, if_false: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of ``if_true`` where ``flags[i]``, else of ``if_false``."""
    keep = torch.tensor(flags, device=if_true.device)[:, None]
    return torch.where(keep, if_true, if_false)
