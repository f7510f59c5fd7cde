"""Pooling requests' answers (``SamplingParams.pooling``), from the final norm's output at the
prompt positions each one pools (`Request.pool_range`: the last, the first, or all of them):
the pooled vector itself (an embedding, of unit length where asked) or a sequence classifier's
class probabilities (or raw logits).

A prompt computed in several steps (chunked prefill) is pooled piece by piece: each step sums
the rows it computed, the commit adds the sum to the request (`PoolPart`), and the step that
finishes the prompt answers from the whole sum. A recomputed prompt (after a preemption) skips
the positions already added. A step launched while the one before it is still in flight (async
scheduling) adds that step's sums too, which are not committed yet.

The answers stay on the device (`PoolAnswers`) and travel to the host with the step's token ids,
so a step that pools need not be finished at launch.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from spyglass.core.engine.runner.row_tensors import fields_to_host, per_row
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


@dataclass(frozen=True, slots=True)
class PoolAnswers:
    """The answers of the pooling requests whose prompt a step finished, one after another in a
    float32 ``values``: the request at ``indices[k]`` among the step's ``num_scheduled`` has the
    next ``lengths[k]`` of them (its vector, or its class probabilities or logits)."""

    num_scheduled: int
    indices: tuple[int, ...]
    lengths: tuple[int, ...]
    values: torch.Tensor

    def to_host(self) -> "PoolAnswers":
        """The same answers on their way to pinned host memory (on a GPU; `fields_to_host`)."""
        return fields_to_host(self, "values")

    def answers(self) -> tuple[Pooled, ...]:
        """Per scheduled request, its answer (None for those the step did not answer), from
        values on the host."""
        answers: list[Pooled] = [None] * self.num_scheduled
        values, start = self.values.tolist(), 0
        for index, length in zip(self.indices, self.lengths):
            answers[index] = values[start : start + length]
            start += length
        return tuple(answers)


@dataclass(frozen=True, slots=True)
class PooledWork:
    """What a step's pooling requests got from its forward (`pool`): the answers of those
    whose prompt it finished (on the host, still being copied on a GPU, once the step is sampled),
    and what it adds to the sums of the others, per scheduled request and by request id (where a
    step launched after it, before its commit, reads them)."""

    answers: PoolAnswers | None = None
    parts: tuple[PoolPart | None, ...] = ()
    sums: dict[str, torch.Tensor] = field(default_factory=dict)

    def to_host(self) -> "PooledWork":
        """The same work with the answers on their way to the host."""
        if self.answers is None:
            return self
        return replace(self, answers=self.answers.to_host())


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
    in_flight: Mapping[str, torch.Tensor],
) -> PooledWork:
    """The answers of the requests whose prompt the step finishes, and what the step adds to the
    sums of those whose prompt it does not; ``final_hidden`` holds the slices' rows in order,
    ``classify`` is the model's classification head and ``in_flight`` the sums, by request id, of
    the step still in flight before this one."""
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
        # Added as the commits add them, so that the vector is the one stepping in turn gives.
        earlier = add_sums(request.pool_sum, in_flight.get(request.req_id))
        if earlier is not None:
            hidden_sum = hidden_sum + earlier
        first, last = request.pool_range
        finished.append(piece.index)
        vectors.append(hidden_sum / (last - first))
    sums = {s.request.req_id: p.hidden_sum for s, p in zip(scheduled, parts) if p is not None}
    if not finished:
        return PooledWork(None, tuple(parts), sums)
    answers = _answers(torch.stack(vectors), finished, scheduled, classify)
    lengths = tuple(answer.shape[0] for answer in answers)
    pooled = PoolAnswers(len(scheduled), tuple(finished), lengths, torch.cat(answers))
    return PooledWork(pooled, tuple(parts), sums)


def add_sums(first: torch.Tensor | None, second: torch.Tensor | None) -> torch.Tensor | None:
    """``first + second`` (a request's sum, then a step's), either of them absent."""
    if first is None or second is None:
        return second if first is None else first
    return first + second


def _answers(
    vectors: torch.Tensor,
    indices: list[int],
    scheduled: tuple[ScheduledRequest, ...],
    classify: Callable[[torch.Tensor], torch.Tensor],
) -> list[torch.Tensor]:
    """The pooled ``vectors`` (float32, one per finished request at ``indices``) turned into
    answers on their device: embeddings (cut to their ``dimensions``, then of unit length where
    asked) or class probabilities (or logits)."""
    params = [scheduled[index].request.sampling_params.pooling for index in indices]
    answers: dict[int, torch.Tensor] = {}
    for k, p in enumerate(params):
        if p.task == "embed":
            # ``dimensions`` (a Matryoshka-trained model's shorter vector): the first ones.
            vector = vectors[k, : p.dimensions]
            if p.normalize:
                vector = torch.nn.functional.normalize(vector, dim=-1)
            answers[k] = vector
    sort = [k for k, p in enumerate(params) if p.task == "classify"]
    if sort:
        logits = classify(vectors[sort])
        probs = logits.softmax(dim=-1) if logits.shape[-1] > 1 else logits.sigmoid()
        chosen = _where([params[k].activation for k in sort], probs, logits)
        answers.update(zip(sort, chosen))
    return [answers[k] for k in range(len(params))]


def _where(flags: list[bool], if_true: torch.Tensor, if_false: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of ``if_true`` where ``flags[i]``, else of ``if_false``."""
    keep = per_row(flags, torch.bool, if_true.device)[:, None]
    return torch.where(keep, if_true, if_false)
