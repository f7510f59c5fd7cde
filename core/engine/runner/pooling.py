"""Pooling requests' answers (``SamplingParams.pooling``), from the final norm's output at each
one's last prompt token, the row the step samples for it: the vector itself (an embedding, of
unit length where asked) or a sequence classifier's class probabilities (or raw logits)."""

from collections.abc import Callable

import torch

from spyglass.core.engine.sched.scheduler import ScheduledRequest

Pooled = list[float] | None
"""One scheduled request's answer in a step: None unless it pools and the step finished its prompt."""


def pooled_rows(
    scheduled: tuple[ScheduledRequest, ...], sampled_rows: tuple[bool, ...]
) -> dict[int, int]:
    """The scheduled index of each pooling request the step samples (its prompt is then all
    computed), and its row among the step's sampled rows. Empty when the step has none."""
    pooled, row = {}, 0
    for index, (item, is_sampled) in enumerate(zip(scheduled, sampled_rows, strict=True)):
        if not is_sampled:
            continue
        if item.request.sampling_params.pooling is not None:
            pooled[index] = row
        row += item.num_spec_tokens + 1
    return pooled


def pooled_outputs(
    final_hidden: torch.Tensor,
    scheduled: tuple[ScheduledRequest, ...],
    pooled: dict[int, int],
    classify: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[Pooled, ...]:
    """Per scheduled request, its answer in float32 (``final_hidden`` holds the pooled rows in the
    order of ``pooled``; ``classify`` is the model's classification head)."""
    indices = list(pooled)
    params = [scheduled[index].request.sampling_params.pooling for index in indices]
    answers: dict[int, list[float]] = {}
    embed = [k for k, p in enumerate(params) if p.task == "embed"]
    if embed:
        vectors = final_hidden[embed].float()
        unit = torch.nn.functional.normalize(vectors, dim=-1)
        chosen = _where([params[k].normalize for k in embed], unit, vectors)
        answers.update(zip((indices[k] for k in embed), chosen.tolist()))
    sort = [k for k, p in enumerate(params) if p.task == "classify"]
    if sort:
        logits = classify(final_hidden[sort])
        probs = logits.softmax(dim=-1) if logits.shape[-1] > 1 else logits.sigmoid()
        chosen = _where([params[k].activation for k in sort], probs, logits)
        answers.update(zip((indices[k] for k in sort), chosen.tolist()))
    return tuple(answers.get(index) for index in range(len(scheduled)))


def _where(flags: list[bool], if_true: torch.Tensor, if_false: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of ``if_true`` where ``flags[i]``, else of ``if_false``."""
    keep = torch.tensor(flags, device=if_true.device)[:, None]
    return torch.where(keep, if_true, if_false)
