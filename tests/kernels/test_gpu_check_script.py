"""``examples/gpu_check.py`` runs where it matters, on a GPU lent for minutes: its pieces run here first."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_SCRIPT = Path(__file__).parents[2] / "examples" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_throughput_rows_time_both_workloads_and_hf_on_the_device(
    gpu_check, tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    (row,) = gpu_check.throughput_rows("tiny", str(tiny_llama_dir), "cpu", num_requests=2)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[0] == "tiny" and len(cells) == 5
    assert all(cell.endswith(" s)") for cell in cells[1:4])  # tok/s (seconds) for W1, W3, HF
    assert cells[4].endswith("x")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA answer")
def test_without_cuda_it_says_so(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--quick"])
    assert gpu_check.main() == 1
    assert "no CUDA device" in capsys.readouterr().out
