"""The HF static-batching baseline of `spyglass bench throughput --compare-hf`, run in its child process."""

import pytest
import torch

from spyglass.core.cli.bench.hf_static import HFStaticBatching
from spyglass.core.cli.bench.workloads import w1_workload

pytestmark = pytest.mark.slow


def test_hf_static_batching_generates_every_requested_token_in_a_child_process(default_model_path):
    workload = w1_workload(49152, num_requests=2, prompt_len=16, output_len=5)
    result = HFStaticBatching(None, torch.float32).run(workload)
    assert result.num_prompt_tokens == 2 * 16
    assert result.num_output_tokens == 2 * 5
    assert result.seconds > 0


def test_hf_static_batching_reports_the_child_failure():
    with pytest.raises(RuntimeError, match="HF static batching failed"):
        HFStaticBatching("/nonexistent/model.gguf", torch.float32).run(
            w1_workload(49152, num_requests=1)
        )
