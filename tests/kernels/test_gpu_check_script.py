"""``examples/gpu_check.py`` runs where it matters, on a GPU lent for minutes: its pieces run here first."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # The script's attention calls run here under the interpreter; it must be set before triton loads.
    os.environ["TRITON_INTERPRET"] = "1"

from spyglass.kernels import torch_attention, triton_attention

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
    assert all(float(value) >= 0 for c in cells for value in c[2:-1])
    assert all(c[-1] == "0%" for c in cells)  # no CUDA graphs on the CPU: every step eager
    for sampling in (gpu_check.SAMPLING, gpu_check.PENALISED, gpu_check.GRAMMAR):
        header, _rule, *sampled = gpu_check.step_phase_table(
            str(tiny_llama_dir), "cpu", (2,), modes=("scheduling",), sampling=sampling
        )
        assert [row.split("|")[1:3] for row in sampled] == [[" scheduling ", " 2 "]]
        deferred = header.strip("|").split("|").index(" deferred ")
        # Only a grammar's steps sample after the commit before.
        assert (float(sampled[0].strip("|").split("|")[deferred]) > 0) == (
            sampling is gpu_check.GRAMMAR
        )


def test_the_verify_cost_rows_time_each_number_of_drafts(
    gpu_check, tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    _header, _rule, *rows = gpu_check.verify_cost_rows(str(tiny_llama_dir), "cpu", rounds=1)
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == ["0", "1", "2", "3", "4"]
    assert cells[0][2] == "1.00x" and all(float(c[1]) > 0 for c in cells)


def test_the_weight_read_rows_put_the_fastest_step_against_the_weights_read(
    gpu_check, tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    bandwidth = 1e9
    *phase_rows, _blank, verdict = gpu_check.weight_read_rows(str(tiny_llama_dir), "cpu", bandwidth)
    steps = [float(row.strip("|").split("|")[2]) for row in phase_rows[2:]]
    assert [row.strip("|").split("|")[1].strip() for row in phase_rows[2:]] == ["64"] * 3
    weight_bytes = sum(p.stat().st_size for p in tiny_llama_dir.glob("*.safetensors"))
    assert weight_bytes > 0
    read_ms = weight_bytes / bandwidth * 1e3
    assert f"read in {read_ms:.2f} ms" in verdict
    assert f"fastest step {min(steps):.2f} ms" in verdict


def test_the_serving_rows_serve_w3_both_ways_and_compare_with_offline(
    gpu_check, tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    offline, _blank, header, _rule, *rows = gpu_check.serving_table(
        str(tiny_llama_dir), "cpu", 4, seeds=(3, 4)
    )
    assert offline.startswith("offline W3 (4 requests, seeds 3, 4): ")
    rates = offline.split(": ")[1].removesuffix(" output tok/s")
    offline_rates = [float(rate.replace(",", "")) for rate in rates.split(" / ")]
    assert len(offline_rates) == 2 and all(rate > 0 for rate in offline_rates)
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == [
        "engine thread",
        "engine process",
        "engine process, one client process",
        "engine process, stream interval 4",
    ]
    assert all(len(c) == len(header.strip("|").split("|")) for c in cells)
    for c in cells:
        served = [float(rate.replace(",", "")) for rate in c[1].split(" / ")]
        median, per_seed = c[2].split(" (")
        shares = [float(share.removesuffix("%")) for share in per_seed[:-1].split(" / ")]
        # Each load against offline's of its seed. Rates and shares are printed as whole numbers:
        # the share is what rates within half a unit of the printed ones give, within half a
        # point (at a CPU's few tok/s a rate's rounding alone moves a share by points).
        for share, rate, offline_rate in zip(shares, served, offline_rates, strict=True):
            lowest = 100 * (rate - 0.5) / (offline_rate + 0.5) - 0.5
            highest = 100 * (rate + 0.5) / (offline_rate - 0.5) + 0.5
            assert lowest <= share <= highest
        low, high = sorted(shares)
        assert low <= float(median[:-1]) <= high  # the median of two: between them
        assert c[3] == "0"  # none of the requests failed
    # CPU shares: the server's process, the engine's own where it has one, then the client's.
    assert [len(c[-1].split(", ")) for c in cells] == [2, 3, 3, 3]
    assert all(share.endswith("%") for c in cells for share in c[-1].split(", "))


def test_the_hottest_frames_count_each_sample_once_per_function(gpu_check, tmp_path):
    import gpu_serving

    stacks = tmp_path / "stacks.txt"
    stacks.write_text("main;step;launch 6\nmain;step;update;step 3\nmain;idle 1\n")
    rows = gpu_serving.hottest_frames(stacks, count=3)
    assert rows[:5] == [
        "| on stack | at top | function |",
        "|---|---|---|",
        "| 100% | 0% | main |",
        "| 90% | 30% | step |",  # a recursive frame counts once per sample
        "| 60% | 60% | launch |",
    ]
    assert rows[6:] == [
        "| at top | function |",
        "|---|---|",
        "| 60% | launch |",
        "| 30% | step |",
        "| 10% | idle |",
    ]


@pytest.mark.parametrize("num_sms", [1, 64], ids=["unified", "split-k"])
def test_every_swept_tiling_computes_the_attention_of_the_default(gpu_check, num_sms):
    # 2 decodes x 8 KV heads fill one multiprocessor (unified) and leave 64 idle (split-K).
    import gpu_attention  # the script put its folder on sys.path

    inputs = gpu_attention.decode_inputs(256, 2, device="cpu")
    splits = triton_attention.num_kv_splits(2, gpu_attention.KV_HEADS, 2, 1, 256, num_sms)
    assert (splits > 1) == (num_sms > 1)
    expected = torch_attention.paged_attention(*inputs).float()
    defaults = (triton_attention.DEFAULT_TILING, triton_attention.SPLIT_K_TILING, None)
    for tiling in (*gpu_attention.SWEEP[::5], *defaults):
        actual = gpu_attention.tiled(inputs, tiling, num_sms)().float()
        assert (actual - expected).abs().max().item() < 2e-2, tiling
    assert len(set(gpu_attention.SWEEP)) == len(gpu_attention.SWEEP) == 12


def test_the_arrival_rows_count_every_output_token(gpu_check, tiny_llama_dir):
    # Here on the CPU (graphs are CUDA's, so the count is ignored): every request's tokens
    # counted, and every step's forward eager.
    import gpu_arrivals

    run = gpu_arrivals.arrival_run(str(tiny_llama_dir), 512, arrivals=12, device="cpu")
    assert run.num_output == 12 * gpu_arrivals.OUTPUT_LEN
    assert 0 < run.step_seconds < 5 and run.output_per_s > 0
    assert run.packed_share == 0


def test_the_mixed_step_inputs_attend_alike_with_query_tiles_padded_and_packed(gpu_check):
    # The mixed-step table's inputs (a chunk among decodes), small: both grids give the reference.
    import gpu_attention

    inputs = gpu_attention.mixed_inputs(40, 5, 64, device="cpu")
    query = inputs[0]
    assert query.shape[0] == 45 and inputs[5].tolist() == [0, 40, 41, 42, 43, 44, 45]
    assert triton_attention.query_tile_grid(6, 45, 40, 16) == (8, 0)  # packed, of 18 padded
    expected = torch_attention.paged_attention(*inputs).float()
    for pack in (False, True):
        tiling = triton_attention.Tiling(pack_query_tiles=pack)
        actual = triton_attention.unified_attention(*inputs, tiling=tiling).float()
        assert (actual - expected).abs().max().item() < 2e-2, pack


def test_a_failed_section_is_reported_and_the_next_one_still_runs(gpu_check, tmp_path, capsys):
    out = tmp_path / "tables.md"
    report = gpu_check.Report(out)
    report.section("first", lambda: ["| a |"])
    report.section("broken", lambda: [1 / 0])
    report.section("last", lambda: ["| b |"])
    lines = out.read_text().splitlines()
    titles = [line for line in lines if line.startswith("## ")]
    assert [title.split(" (")[0] for title in titles] == ["## first", "## broken", "## last"]
    assert "failed: ZeroDivisionError: division by zero" in lines
    assert "| a |" in lines and "| b |" in lines
    assert report.lines == lines  # what the file holds is what the end of the run prints
    assert "ZeroDivisionError" in capsys.readouterr().err  # with its traceback


def test_a_skipped_section_is_not_run(gpu_check, tmp_path):
    report = gpu_check.Report(tmp_path / "tables.md", skip=("sweep",))
    report.section("tiling sweep", lambda: [1 / 0])
    report.section("kept", lambda: ["| a |"])
    titles = [line for line in report.lines if line.startswith("## ")]
    assert len(titles) == 1 and titles[0].startswith("## kept (")


def test_the_gpu_tests_section_runs_the_gpu_marked_tests(gpu_check, tmp_path, monkeypatch):
    monkeypatch.chdir(_SCRIPT.parents[1])
    rows = gpu_check.gpu_tests(tmp_path / "pytest.log", timeout_s=240)
    summary = rows[-1]
    # on the CPU every one of them is collected and skips; on a GPU they pass
    assert "deselected" in summary and ("skipped" in summary or "passed" in summary), rows
    assert not [row for row in rows if row.startswith(("FAILED", "ERROR"))]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA answer")
def test_without_cuda_it_says_so(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--quick"])
    assert gpu_check.main() == 1
    assert "no CUDA device" in capsys.readouterr().out
