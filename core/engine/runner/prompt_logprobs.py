"""The logprobs of prompt tokens (``SamplingParams.prompt_logprobs``): each position's logits
score the prompt token after it, as the model's raw distribution gives it.

A step's prompt rows are scored together where the logits are, and travel to the host with the
step's token ids (`PromptScores.to_host`): the step need not be finished at launch, so async
output and async scheduling go on through prompts with prompt logprobs."""

from dataclasses import dataclass

import torch

from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.runner.row_tensors import fields_to_host, per_row
from spyglass.core.engine.sched.scheduler import SchedulerOutput


@dataclass(frozen=True, slots=True)
class PromptScores:
    """A step's scored prompt rows: ``counts[i]`` of them for scheduled request ``i``, which wants
    its ``top_ns[i]`` most likely alternatives; per row, the prompt token it scores (``targets``),
    that token's logprob (``chosen``) and rank, and the row's most likely tokens (as many as the
    most any request wants)."""

    counts: tuple[int, ...]
    top_ns: tuple[int, ...]
    targets: tuple[int, ...]
    chosen: torch.Tensor
    ranks: torch.Tensor
    top_values: torch.Tensor
    top_ids: torch.Tensor

    def to_host(self) -> "PromptScores":
        """The same scores on their way to pinned host memory (on a GPU; `fields_to_host`)."""
        return fields_to_host(self, "chosen", "ranks", "top_values", "top_ids")

    def logprobs(self) -> tuple[list[Logprob], ...]:
        """Per scheduled request, a `Logprob` with its rank and alternatives for each of its rows
        (from tensors on the host)."""
        rows = zip(
            self.targets,
            self.chosen.tolist(),
            self.ranks.tolist(),
            self.top_ids.tolist(),
            self.top_values.tolist(),
        )
        scored = []
        for count, top_n in zip(self.counts, self.top_ns):
            scored.append(
                [
                    Logprob(token, value, dict(zip(ids[:top_n], values[:top_n])), rank)
                    for token, value, rank, ids, values in (next(rows) for _ in range(count))
                ]
            )
        return tuple(scored)


def score_prompts(
    out: SchedulerOutput,
    prompt_rows: tuple[int, ...],
    targets: tuple[int, ...],
    logits: torch.Tensor,
) -> PromptScores | None:
    """The scores of ``logits``' rows (``prompt_rows[i]`` of them for scheduled request ``i``, in
    turn, scoring the prompt ``targets``), on the logits' device; None when the step scores no
    prompt token (``prompt_rows`` empty)."""
    if not prompt_rows:
        return None
    top_ns = tuple(
        (s.request.sampling_params.prompt_logprobs or 0) if count else 0
        for s, count in zip(out.scheduled, prompt_rows, strict=True)
    )
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, per_row(list(targets), torch.long, logits.device).unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=1) + 1
    top_values, top_ids = logprobs.topk(max(max(top_ns), 1), dim=-1)
    return PromptScores(prompt_rows, top_ns, targets, chosen[:, 0], ranks, top_values, top_ids)
