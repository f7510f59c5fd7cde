"""Sampled tokens' logprobs, computed where the logits are and read on the host later.

A step whose requests ask for logprobs computes them on the device beside its sampling, and they
travel to the host with the token ids; the step need not be finished at launch, so async
scheduling goes on with such requests. Logprobs are those of the model's raw distribution, as
vLLM reports them.
"""

from dataclasses import dataclass

import torch

from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.row_tensors import fields_to_host, per_row


@dataclass(frozen=True, slots=True)
class LogprobRows:
    """The logprobs of the rows that asked for them: row ``rows[i]`` wants its ``counts[i]`` most
    likely tokens; ``chosen[i]`` is its sampled token's logprob, ``top_values[i]`` and
    ``top_ids[i]`` its most likely tokens' (as many as the most any row wants)."""

    rows: list[int]
    counts: list[int]
    chosen: torch.Tensor
    top_values: torch.Tensor
    top_ids: torch.Tensor

    def to_host(self) -> "LogprobRows":
        """The same rows on their way to pinned host memory (on a GPU; `fields_to_host`)."""
        return fields_to_host(self, "chosen", "top_values", "top_ids")


def logprob_rows(
    raw: torch.Tensor, token_ids: torch.Tensor, requests: list[Request]
) -> LogprobRows | None:
    """The logprobs of the sampled ``token_ids`` (one per row of ``raw``, on its device) for the
    requests that ask for them; None when none does."""
    rows = [row for row, r in enumerate(requests) if r.sampling_params.logprobs is not None]
    if not rows:
        return None
    counts = [requests[row].sampling_params.logprobs for row in rows]
    where = per_row(rows, torch.long, raw.device)
    logprobs = raw[where].log_softmax(dim=-1)
    top_values, top_ids = logprobs.topk(max(max(counts), 1), dim=-1)
    chosen = logprobs.gather(1, token_ids[where].unsqueeze(1)).squeeze(1)
    return LogprobRows(rows, counts, chosen, top_values, top_ids)


def logprob_list(
    logprobs: LogprobRows | None, token_ids: list[int], num_rows: int
) -> list[Logprob | None]:
    """Per row, its sampled token's `Logprob` (None for a row that did not ask), from tensors on
    the host."""
    result: list[Logprob | None] = [None] * num_rows
    if logprobs is None:
        return result
    chosen = logprobs.chosen.tolist()
    top_values, top_ids = logprobs.top_values.tolist(), logprobs.top_ids.tolist()
    for i, (row, count) in enumerate(zip(logprobs.rows, logprobs.counts)):
        top = dict(zip(top_ids[i][:count], top_values[i][:count]))
        result[row] = Logprob(token_ids[row], chosen[i], top)
    return result
