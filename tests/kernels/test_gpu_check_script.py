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
    assert cells[0] == "tiny" and len(cells) == 7
    # tok/s (seconds) for W1, W3, both again with async scheduling, and HF
    assert all(cell.endswith(" s)") for cell in cells[1:6])
    assert cells[6].endswith("x")


def test_the_step_phase_rows_cover_every_mode_and_every_batch(
    gpu_check, tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    header, _rule, *rows = gpu_check.step_phase_table(str(tiny_llama_dir), "cpu", (1, 3))
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [(c[0], c[1]) for c in cells] == [
        (mode, batch) for mode in ("off", "output", "scheduling") for batch in ("1", "3")
    ]
    assert all(len(c) == len(header.strip("|").split("|")) for c in cells)
    assert all(float(value) >= 0 for c in cells for value in c[2:])


def test_the_serving_rows_serve_w3_both_ways_and_compare_with_offline(
    gpu_check, tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    offline, _blank, header, _rule, *rows = gpu_check.serving_table(str(tiny_llama_dir), "cpu", 4)
    assert offline.startswith("offline W3 (4 requests):")
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == ["engine thread", "engine process"]
    assert all(len(c) == len(header.strip("|").split("|")) for c in cells)
    assert all(c[2].endswith("%") and c[3] == "0" for c in cells)  # none of the requests failed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA answer")
def test_without_cuda_it_says_so(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--quick"])
    assert gpu_check.main() == 1
    assert "no CUDA device" in capsys.readouterr().out
