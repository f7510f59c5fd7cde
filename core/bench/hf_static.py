"""HF transformers static batching: the baseline operators compare continuous batching against.

Test-and-benchmark-only: needs ``transformers`` (the ``test`` extra).
"""

import time

import torch

from spyglass.core.bench.results import RunResult
from spyglass.core.bench.workloads import BenchRequest
from spyglass.core.default_model import ensure_default_model


class HFStaticBatching:
    """One padded batch through ``model.generate``, greedy, every request forced to its output length."""

    def __init__(self, model: str | None, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM

        path = ensure_default_model() if model is None else model
        kwargs = {"gguf_file": str(path)} if str(path).endswith(".gguf") else {}
        directory = str(path.parent) if kwargs else str(path)
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs).eval()

    @torch.inference_mode()
    def run(self, workload: list[BenchRequest]):
        """Generate the whole workload as one batch (prompts must share a length, as in W1)."""
        lengths = {len(r.prompt_token_ids) for r in workload}
        if len(lengths) != 1:
            raise ValueError("HF static batching is only run on uniform-length workloads such as W1")
        output_len = max(r.output_len for r in workload)
        input_ids = torch.tensor([r.prompt_token_ids for r in workload])
        start = time.perf_counter()
        out = self.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            pad_token_id=0,
        )
        seconds = time.perf_counter() - start
        return RunResult(seconds, input_ids.numel(), (out.shape[1] - input_ids.shape[1]) * len(workload))
