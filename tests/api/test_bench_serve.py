"""``spyglass bench serve`` against the tiny server: every request completes with the workload's lengths."""

import json
import math
import subprocess
import sys

from spyglass.core.cli.bench.workloads import w3_workload


def _bench(command: str, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """``spyglass bench <command> ARGS``, run to its end."""
    argv = [sys.executable, "-m", "spyglass.core.cli.main", "bench", command, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def test_bench_serve_reports_latencies(tiny_server, tmp_path):
    out = tmp_path / "serve.json"
    finished = _bench(
        "serve",
        "--base-url",
        tiny_server.base_url,
        "--num-prompts",
        "4",
        "--concurrency",
        "2",
        "--json",
        str(out),
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "Mean TTFT (ms):" in finished.stdout and "P99 ITL (ms):" in finished.stdout
    record = json.loads(out.read_text())
    workload = w3_workload(49152, 4, 3)
    assert record["completed"] == 4 and record["failed"] == 0
    assert record["total_output_tokens"] == sum(r.output_len for r in workload)
    assert record["total_input_tokens"] == sum(len(r.prompt_token_ids) for r in workload)
    assert record["ttft_ms"]["mean"] > 0 and record["e2e_ms"]["p99"] >= record["e2e_ms"]["median"]


def test_bench_serve_not_streamed(tiny_server, tmp_path):
    """Whole answers: every token counted from the usage, end-to-end latency only."""
    out = tmp_path / "whole.json"
    finished = _bench(
        "serve",
        "--base-url",
        tiny_server.base_url,
        "--num-prompts",
        "4",
        "--no-stream",
        "--json",
        str(out),
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "not streamed" in finished.stdout and "TTFT" not in finished.stdout
    record = json.loads(out.read_text())
    workload = w3_workload(49152, 4, 3)
    assert record["completed"] == 4
    assert record["total_output_tokens"] == sum(r.output_len for r in workload)
    assert record["ttft_ms"] is None and record["e2e_ms"]["median"] > 0


def test_bench_serve_with_a_rate(tiny_server):
    finished = _bench(
        "serve", "--base-url", tiny_server.base_url, "--num-prompts", "3", "--rate", "20"
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "Successful requests:                    3" in finished.stdout


def test_bench_soak_loses_nothing_and_leaks_no_blocks(tiny_server, tmp_path):
    out = tmp_path / "soak.json"
    finished = _bench(
        "soak",
        "--base-url",
        tiny_server.base_url,
        "--num-requests",
        "60",
        "--disconnect-share",
        "0.3",
        "--concurrency",
        "6",
        "--max-tokens",
        "24",
        "--json",
        str(out),
        timeout=300,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    report = json.loads(out.read_text())
    assert report["lost"] == 0 and report["errors"] == {}
    assert report["completed"] + report["aborted"] == 60 and report["aborted"] > 0
    assert report["kv_blocks_in_use"] == 0 and report["rss_end_mib"] > 0


def test_bench_serve_from_client_processes_sends_every_request_once(tiny_server, tmp_path):
    out = tmp_path / "serve.json"
    finished = _bench(
        "serve", "--base-url", tiny_server.base_url, "--num-prompts", "5",
        "--client-processes", "2", "--json", str(out),
    )  # fmt: skip
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "2 client processes" in finished.stdout
    record = json.loads(out.read_text())
    workload = w3_workload(49152, 5, 3)
    assert record["completed"] == 5 and record["failed"] == 0
    # Each request of the workload once: the same lengths, whichever process sent it.
    assert sorted((r["prompt_len"], r["output_len"]) for r in record["per_request"]) == sorted(
        (len(r.prompt_token_ids), r.output_len) for r in workload
    )
    assert record["duration_s"] >= max(r["e2e"] for r in record["per_request"])


def test_bench_serve_shares_the_load_between_its_processes():
    import argparse

    from spyglass.core.cli.bench.serve_clients import share_args

    closed = argparse.Namespace(concurrency=5, rate=math.inf, seed=3)
    assert [share_args(closed, i, 3).concurrency for i in range(3)] == [2, 2, 1]
    poisson = argparse.Namespace(concurrency=None, rate=12.0, seed=3)
    assert [(share_args(poisson, i, 3).rate, share_args(poisson, i, 3).seed) for i in range(3)] == [
        (4.0, 3),
        (4.0, 4),
        (4.0, 5),
    ]


def test_bench_serve_refuses_no_client_process():
    finished = _bench("serve", "--client-processes", "0", timeout=60)
    assert finished.returncode == 2 and "--client-processes" in finished.stderr


def test_bench_serve_refuses_more_client_processes_than_clients():
    finished = _bench("serve", "--concurrency", "2", "--client-processes", "4", timeout=60)
    assert finished.returncode == 2 and "must not exceed --concurrency" in finished.stderr
