"""``spyglass bench policies`` and ``spyglass bench prefix-cache`` run end to end at toy scale on the tiny model."""

from spyglass.core.cli.main import build_parser

TINY = ["--dtype", "float32", "--device", "cpu", "--kv-cache-memory", "16MiB", "--num-threads", "1"]


def run(argv: list[str]) -> int:
    args = build_parser(argv).parse_args(argv)
    return args.run(args)


def test_bench_policies_prints_a_row_per_policy_and_class(tiny_llama_dir, capsys):
    argv = ["bench", "policies", "--model", str(tiny_llama_dir), *TINY, "--num-interactive", "3", "--num-batch", "2",
            "--batch-prompt-len", "24", "--batch-output-len", "6", "--interactive-output-len", "2"]  # fmt: skip
    assert run(argv) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(row[0], row[1]) for row in rows] == [
        (policy, cls)
        for policy in ("fcfs", "static", "priority", "fair", "slo")
        for cls in ("batch", "interactive")
    ]


def test_bench_prefix_cache_reports_hits_only_with_the_cache(tiny_llama_dir, capsys):
    argv = ["bench", "prefix-cache", "--model", str(tiny_llama_dir), *TINY, "--system-len", "64",
            "--num-questions", "4", "--question-len", "4", "--output-len", "2", "--plugins", "fcfs"]  # fmt: skip
    assert run(argv) == 0
    out = capsys.readouterr().out
    rows = {
        line[:14].strip(): line.split()
        for line in out.splitlines()
        if line.startswith(("no cache", "prefix"))
    }
    assert rows["no cache"][-1] == "0%" and rows["prefix cache"][-1] != "0%"
    assert "median TTFT speed-up" in out


def test_bench_throughput_reports_every_telemetry_level_at_toy_scale(tiny_llama_dir, capsys):
    from spyglass.telemetry import settings as telemetry_settings

    settings_before = telemetry_settings.current()
    argv = ["bench", "throughput", "--model", str(tiny_llama_dir), *TINY, "--workloads", "w1", "--num-requests", "3",
            "--repeats", "2", "--telemetry", "off", "--compare-telemetry", "metrics,full"]  # fmt: skip
    assert run(argv) == 0
    out = capsys.readouterr().out
    assert "w1: 3 requests, 384 prompt tokens, 384 output tokens" in out
    rows = {
        line.split()[0]: line.split() for line in out.splitlines() if line.startswith("telemetry-")
    }
    assert set(rows) == {"telemetry-off", "telemetry-metrics", "telemetry-full"}
    assert rows["telemetry-off"][-1] == "1.00x"
    # Later engines in the process (other tests, a server) get the telemetry they had before.
    assert telemetry_settings.current() == settings_before


def test_bench_throughput_rotates_which_configuration_runs_first():
    from spyglass.core.cli.bench.throughput import _rotated

    configurations = ["off", "metrics", "full"]
    assert [_rotated(configurations, repeat)[0] for repeat in range(4)] == [
        "off",
        "metrics",
        "full",
        "off",
    ]
    assert all(
        sorted(_rotated(configurations, repeat)) == sorted(configurations) for repeat in range(3)
    )


def test_bench_throughput_compares_a_json_schema_run_generating_as_many_tokens(
    tiny_llama_dir, capsys
):
    argv = ["bench", "throughput", "--model", str(tiny_llama_dir), *TINY, "--workloads", "w1", "--num-requests", "2",
            "--repeats", "1", "--compare-schema"]  # fmt: skip
    assert run(argv) == 0
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("fcfs", "json-schema "))
    }
    assert set(rows) == {"fcfs", "json-schema"} and rows["fcfs"][-1] == "1.00x"
    assert "json-schema / fcfs time:" in out


def test_benches_keep_per_request_log_lines_out_unless_asked(tiny_llama_dir):
    import subprocess
    import sys

    def stderr(*bench_options: str) -> str:
        workload = [
            "--system-len",
            "16",
            "--num-questions",
            "2",
            "--question-len",
            "4",
            "--output-len",
            "2",
        ]
        plugins = ["--plugins", "fcfs,request_log"]
        argv = [
            "bench",
            *bench_options,
            "prefix-cache",
            "--model",
            str(tiny_llama_dir),
            *TINY,
            *workload,
            *plugins,
        ]
        command = [sys.executable, "-m", "spyglass.core.cli.main", *argv]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stderr

    assert "request finished" not in stderr()
    assert "request finished" in stderr("--log-requests")
