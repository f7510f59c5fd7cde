"""Embedding requests' vectors (``SamplingParams.pooling``): the final norm's output at each one's
last prompt token, the row the step samples for it."""

import torch

from spyglass.core.engine.sched.scheduler import ScheduledRequest

Embedding = list[float] | None
"""One scheduled request's embedding in a step: None unless the step finished its prompt."""


def pooled_rows(
    scheduled: tuple[ScheduledRequest, ...], sampled_rows: tuple[bool, ...]
) -> dict[int, int]:
    """The scheduled index of each embedding request the step samples (its prompt is then all
    computed), and its row among the step's sampled rows. Empty when the step has none."""
    pooled, row = {}, 0
    for index, (item, is_sampled) in enumerate(zip(scheduled, sampled_rows, strict=True)):
        if not is_sampled:
            continue
        if item.request.sampling_params.pooling is not None:
            pooled[index] = row
        row += item.num_spec_tokens + 1
    return pooled


def embeddings(
    final_hidden: torch.Tensor,
    scheduled: tuple[ScheduledRequest, ...],
    pooled: dict[int, int],
) -> tuple[Embedding, ...]:
    """Per scheduled request, its embedding (``final_hidden`` holds the pooled rows in the order of
    ``pooled``), in float32 and scaled to unit length where its ``normalize`` asks."""
    vectors = final_hidden.float()
    normalize = [scheduled[index].request.sampling_params.pooling.normalize for index in pooled]
    if any(normalize):
        unit = torch.nn.functional.normalize(vectors, dim=-1)
        keep = torch.tensor(normalize, device=vectors.device)[:, None]
        vectors = torch.where(keep, unit, vectors)
    by_index = dict(zip(pooled, vectors.tolist()))
    return tuple(by_index.get(index) for index in range(len(scheduled)))
