"""`logprob_rows` and `logprob_list`: the sampled tokens' logprobs and top alternatives, computed on
the logits' device and read on the host, against the definition row by row."""

import pytest
import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.logprob_rows import logprob_list, logprob_rows
from spyglass.core.engine.sampling_params import SamplingParams
from tests.core.conftest import ON_CUDA


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_each_row_that_asks_gets_its_tokens_logprob_and_top_alternatives(device):
    generator = torch.Generator().manual_seed(0)
    raw = torch.randn(5, 300, generator=generator) * 3
    wanted = [None, 0, 3, None, 7]
    requests = [Request(str(i), [1], SamplingParams(logprobs=n)) for i, n in enumerate(wanted)]
    token_ids = torch.tensor([4, 17, 250, 9, 123])
    rows = logprob_rows(raw.to(device), token_ids.to(device), requests).to_host()
    if device == "cuda":
        torch.cuda.synchronize()  # what the step's copy event stands for
    logprobs = logprob_list(rows, token_ids.tolist(), len(requests))
    expected = raw.log_softmax(dim=-1)
    for row, n in enumerate(wanted):
        if n is None:
            assert logprobs[row] is None
            continue
        got = logprobs[row]
        assert got.token_id == int(token_ids[row])
        assert got.logprob == pytest.approx(float(expected[row, token_ids[row]]), abs=1e-5)
        values, ids = expected[row].topk(n) if n else (torch.empty(0), torch.empty(0))
        assert list(got.top) == ids.tolist()
        assert list(got.top.values()) == pytest.approx(values.tolist(), abs=1e-5)


def test_no_row_asking_is_no_work():
    requests = [Request("a", [1], SamplingParams())]
    assert logprob_rows(torch.zeros(1, 8), torch.tensor([2]), requests) is None
    assert logprob_list(None, [2], 1) == [None]
