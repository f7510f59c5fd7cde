"""HF transformers static batching: the baseline operators compare continuous batching against.

Each run happens in a child process (``python -m spyglass.core.cli.bench.hf_static``), so the two
engines never share a process: with HF loaded and run in the bench's own process, Spyglass's runs
came out 5-15% slower than in a bench without HF.
Test-and-benchmark-only: needs ``transformers`` (the ``test`` extra).
"""

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from spyglass.core.cli.bench.results import RunResult
from spyglass.core.cli.bench.workloads import BenchRequest
from spyglass.core.engine.config import dtype_name
from spyglass.core.loaders.default_model import default_model_override, ensure_default_model


class HFStaticBatching:
    """Times one padded batch through ``model.generate`` in a fresh child process per run."""

    def __init__(self, model: str | None, dtype: torch.dtype, device: str = "cpu"):
        self.model = model
        self.dtype = dtype_name(dtype)
        self.device = device

    def run(self, workload: list[BenchRequest]) -> RunResult:
        """Generate the whole workload as one batch in a child process; its timing of ``generate`` alone."""
        command = [
            sys.executable,
            "-m",
            "spyglass.core.cli.bench.hf_static",
            "--dtype",
            self.dtype,
            "--num-threads",
            str(torch.get_num_threads()),
            "--device",
            self.device,
        ]
        if self.model is not None:
            command += ["--model", self.model]
        requests = [
            {"prompt_token_ids": r.prompt_token_ids, "output_len": r.output_len} for r in workload
        ]
        child = subprocess.run(
            command, input=json.dumps(requests), capture_output=True, text=True, check=False
        )
        if child.returncode != 0:
            raise RuntimeError(f"HF static batching failed:\n{child.stderr[-2000:]}")
        return RunResult(**json.loads(child.stdout.strip().splitlines()[-1]))


def load_hf_model(model_class: type, model_path: str | None, dtype: torch.dtype, device: str):
    """``model_class`` (a transformers auto class) of the bench's model (the default one when
    ``model_path`` is None; a GGUF file through transformers' own reader), in eval mode on ``device``."""
    path = Path(model_path) if model_path else default_model_override() or ensure_default_model()
    kwargs = {"gguf_file": str(path)} if path.suffix == ".gguf" else {}
    directory = str(path.parent) if kwargs else str(path)
    return model_class.from_pretrained(directory, dtype=dtype, **kwargs).eval().to(device)


def _generate(
    model_path: str | None, dtype: torch.dtype, workload: list[BenchRequest], device: str
) -> RunResult:
    """Load the model on ``device`` and generate the workload as one batch (prompts must share a
    length, as in W1)."""
    from transformers import AutoModelForCausalLM

    lengths = {len(r.prompt_token_ids) for r in workload}
    if len(lengths) != 1:
        raise ValueError("HF static batching is only run on uniform-length workloads such as W1")
    model = load_hf_model(AutoModelForCausalLM, model_path, dtype, device)
    output_len = max(r.output_len for r in workload)
    input_ids = torch.tensor([r.prompt_token_ids for r in workload], device=device)
    with torch.inference_mode():
        if input_ids.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            pad_token_id=0,
        )
        if input_ids.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return RunResult(
        seconds, input_ids.numel(), (out.shape[1] - input_ids.shape[1]) * len(workload)
    )


def main() -> None:
    """Child-process entry: the workload as JSON on stdin, the `RunResult` as JSON on the last stdout line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--num-threads", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.num_threads)
    workload = [BenchRequest(r["prompt_token_ids"], r["output_len"]) for r in json.load(sys.stdin)]
    result = _generate(args.model, getattr(torch, args.dtype), workload, args.device)
    print(json.dumps(dataclasses.asdict(result)))


if __name__ == "__main__":
    main()
