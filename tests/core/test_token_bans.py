"""Banned tokens (``min_tokens``' stop tokens, bad words' last tokens) masked by `adjust_logits`
against the definition: a word's last token is banned where the output ends with its other tokens.
With async scheduling a request's newest token may still be on the device: a word it may complete
is banned there, when the token is the word's next-to-last one."""

import random

import pytest
import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.sampler import adjust_logits
from spyglass.core.engine.sampling_params import SamplingParams
from tests.core.conftest import ON_CUDA, pending_tokens

VOCAB = 12
EOS = 11


def banned_from_scratch(request: Request, output: list[int]) -> set[int]:
    """The tokens the definition bans after ``output``."""
    banned = set()
    if len(output) < request.sampling_params.min_tokens:
        banned |= {EOS, *request.sampling_params.stop_token_ids}
    for word in request.bad_word_ids:
        before = len(word) - 1
        if before <= len(output) and tuple(output[len(output) - before :]) == word[:-1]:
            banned.add(word[-1])
    return banned


def _request(rng: random.Random, at: int) -> Request:
    # Few distinct tokens, so that outputs end with words' beginnings often.
    words = {tuple(rng.randrange(4) for _ in range(rng.randint(1, 3))) for _ in range(3)}
    params = SamplingParams(
        min_tokens=rng.choice((0, 0, 4)),
        stop_token_ids=[10],
        allowed_token_ids=rng.choice((None, None, [0, 1, 2, 3])),
        bad_words=["tokenized by the engine"],  # into the ids set below
    )
    request = Request(f"r{at}", [5, 6], params, eos_token_ids=(EOS,))
    request.bad_word_ids = tuple(sorted(words))
    request.output_token_ids = [rng.randrange(4) for _ in range(rng.randint(0, 6))]
    return request


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize("pending", [False, True], ids=["committed", "pending tokens"])
def test_banned_tokens_are_those_of_the_definition(pending, device):
    rng = random.Random(1)
    generator = torch.Generator().manual_seed(1)
    num_conditional = 0
    for _ in range(40):
        batch = [_request(rng, at) for at in range(6)]
        in_flight, tokens = pending_tokens(batch, rng, device, 4) if pending else (None, {})
        for request in batch:
            request.num_pending_tokens = int(request.req_id in tokens)
        logits = torch.randn(len(batch), VOCAB, generator=generator)
        masked = adjust_logits(logits.to(device), batch, pending=in_flight).cpu()
        for row, request in enumerate(batch):
            output = request.output_token_ids + (
                [tokens[request.req_id]] if request.req_id in tokens else []
            )
            allowed = request.sampling_params.allowed_token_ids or range(VOCAB)
            expected = torch.full((VOCAB,), float("-inf"))
            kept = [t for t in allowed if t not in banned_from_scratch(request, output)]
            kept = kept or list(allowed)  # a ban never leaves nothing to sample
            expected[kept] = logits[row, kept]
            torch.testing.assert_close(masked[row], expected)
            num_conditional += request.req_id in tokens and any(
                len(w) > 1 for w in request.bad_word_ids
            )
    assert num_conditional > 50 or not pending
