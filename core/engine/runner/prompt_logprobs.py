"""The logprobs of prompt tokens (``SamplingParams.prompt_logprobs``): each position's logits
score the prompt token after it, as the model's raw distribution gives it."""

import torch

from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.sched.scheduler import SchedulerOutput


def score_prompts(
    out: SchedulerOutput, prompt_rows: tuple[int, ...], logits: torch.Tensor
) -> tuple[list[Logprob], ...]:
    """Per scheduled request, a `Logprob` (with its rank, and the request's number of top
    alternatives) for each of its ``prompt_rows`` rows of ``logits``: the prompt tokens after the
    ones it has scored before. Empty when no request asks for prompt logprobs."""
    if not prompt_rows:
        return ()
    logprobs = logits.float().log_softmax(dim=-1)
    scored: list[list[Logprob]] = []
    row = 0
    for scheduled, count in zip(out.scheduled, prompt_rows, strict=True):
        request = scheduled.request
        if not count:
            scored.append([])
            continue
        first = len(request.prompt_logprobs)  # the first prompt token not scored yet
        targets = torch.tensor(
            request.prompt_token_ids[first : first + count], device=logits.device
        )
        rows = logprobs[row : row + count]
        row += count
        chosen = rows.gather(1, targets[:, None])
        ranks = (rows > chosen).sum(dim=1) + 1
        top_n = request.sampling_params.prompt_logprobs
        top_values, top_ids = rows.topk(max(top_n, 1), dim=-1)
        scored.append(
            [
                Logprob(token, value, dict(zip(ids[:top_n], values[:top_n])), rank)
                for token, value, rank, ids, values in zip(
                    targets.tolist(),
                    chosen[:, 0].tolist(),
                    ranks.tolist(),
                    top_ids.tolist(),
                    top_values.tolist(),
                )
            ]
        )
    return tuple(scored)
