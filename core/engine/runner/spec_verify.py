"""Verifying draft tokens against the target model: the rule that keeps the output distribution unchanged.

Drafts are point proposals (a proposer's distribution q is one-hot on its draft), so standard
speculative sampling reduces to: accept draft d at position i with probability p_i(d); on the first
rejection, sample from p_i with d removed and renormalised; if all are accepted, sample a bonus
token from the last position. Greedy requests accept the longest prefix equal to the argmax.
"""

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.row_tensors import argmax_rows
from spyglass.core.engine.runner.token_draw import target_probs


def _uniform(request: Request) -> float:
    return (
        float(torch.rand((), generator=request.generator))
        if request.generator
        else float(torch.rand(()))
    )


def _sample(probs: torch.Tensor, request: Request) -> int:
    return int(torch.multinomial(probs, 1, generator=request.generator))


def verify_drafts(logits: torch.Tensor, request: Request, drafts: list[int]) -> list[int]:
    """Tokens to append for one request: the accepted drafts, then one token from the target model.

    ``logits`` holds ``len(drafts) + 1`` float32 rows: position i scores the token after draft i-1.
    """
    if request.sampling_params.greedy:
        targets = argmax_rows(logits).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
            accepted += 1
        return drafts[:accepted] + [targets[accepted]]
    probs = target_probs(logits, [request] * logits.shape[0])
    for position, draft in enumerate(drafts):
        if _uniform(request) < float(probs[position, draft]):
            continue
        residual = probs[position].clone()
        residual[draft] = 0.0
        return drafts[:position] + [_sample(residual / residual.sum(), request)]
    return drafts + [_sample(probs[len(drafts)], request)]
