"""`PenaltyCounts` kept across steps against penalties computed from each request's whole prompt and
output at every step, and its histories let go when requests finish."""

import random

import pytest
import torch

from spyglass.core.engine.request import FinishReason, Request, RequestStatus
from spyglass.core.engine.runner.penalty_counts import PenaltyCounts
from spyglass.core.engine.sampling_params import SamplingParams
from tests.core.conftest import ON_CUDA, pending_tokens

VOCAB = 50


def penalised_from_scratch(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """The definition, row by row: repetition over prompt and output, then frequency and presence
    over the output."""
    logits = logits.clone()
    for row, request in enumerate(requests):
        params = request.sampling_params
        for token_id in set(request.prompt_token_ids + request.output_token_ids):
            value = logits[row, token_id]
            penalty = params.repetition_penalty
            logits[row, token_id] = value / penalty if value > 0 else value * penalty
        for token_id in set(request.output_token_ids):
            count = request.output_token_ids.count(token_id)
            logits[row, token_id] -= params.frequency_penalty * count + params.presence_penalty
    return logits


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize("pending", [False, True], ids=["committed", "pending tokens"])
def test_counts_kept_across_steps_penalise_as_the_whole_history_does(pending, device):
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    counts = PenaltyCounts()
    live: list[Request] = []
    for step in range(60):
        while len(live) < 6:  # requests come and go: finished ones give their rows back
            params = SamplingParams(
                repetition_penalty=rng.choice((1.0, 1.3, 0.7)),
                frequency_penalty=rng.choice((0.0, 0.4)),
                presence_penalty=rng.choice((0.0, -0.5, 0.8)),
            )
            # Short prompts are counted token by token, long ones by a sort.
            prompt = [rng.randrange(VOCAB) for _ in range(rng.choice((3, 20, 70, 300)))]
            request = Request(f"r{step}-{len(live)}", prompt, params)
            # Some come with an output already (a long one is counted by a sort too).
            request.output_token_ids = [rng.randrange(VOCAB) for _ in range(rng.choice((0, 90)))]
            live.append(request)
        batch = rng.sample(live, rng.randint(1, len(live)))  # not every request every step
        logits = torch.randn(len(batch), VOCAB, generator=generator)
        in_flight, tokens = pending_tokens(batch, rng, device, VOCAB) if pending else (None, {})
        pending_ones = [r for r in batch if r.req_id in tokens]
        for request in pending_ones:  # the definition reads the pending token as output
            request.output_token_ids.append(tokens[request.req_id])
        expected = penalised_from_scratch(logits, batch)
        for request in pending_ones:  # not on the host yet
            request.output_token_ids.pop()
        penalised = logits.to(device)
        counts.apply(penalised, batch, in_flight)
        for request in pending_ones:  # committed after the step
            request.output_token_ids.append(tokens[request.req_id])
        # Requests without any penalty are left as they were (the from-scratch build agrees).
        torch.testing.assert_close(penalised.cpu(), expected)
        # Finished requests' histories were let go: only live requests' are kept.
        assert counts.num_requests <= len(live)
        for request in batch:
            request.output_token_ids += [rng.randrange(VOCAB) for _ in range(rng.randint(0, 2))]
        for request in [r for r in live if rng.random() < 0.15]:
            request.status = RequestStatus.FINISHED
            request.finish_reason = FinishReason.LENGTH
            live.remove(request)


def test_a_finished_requests_history_is_not_another_requests_with_its_id():
    counts = PenaltyCounts()
    first = Request("a", [3, 3], SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0))
    first.output_token_ids = [4, 4]
    counts.apply(torch.ones(1, 8), [first])
    first.status = RequestStatus.FINISHED
    second = Request("a", [5], SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0))
    logits = torch.ones(1, 8)
    counts.apply(logits, [second])  # the same id again, a new request: nothing of the first's
    assert logits[0].tolist() == [1, 1, 1, 1, 1, 0.5, 1, 1]
