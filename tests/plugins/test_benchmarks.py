"""``spyglass bench policies`` and ``spyglass bench prefix-cache`` run end to end at toy scale on the tiny model."""

import json

from spyglass.core.cli.bench import step_phases
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


def test_bench_latency_compares_speculation_and_times_verification_by_draft_count(
    tiny_llama_dir, capsys
):
    argv = ["bench", "latency", "--model", str(tiny_llama_dir), *TINY, "--max-tokens", "6",
            "--repeats", "1", "--speculative", "ngram,ngram+prediction",
            "--num-speculative-tokens", "3", "--verify-cost"]  # fmt: skip
    assert run(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.startswith(("copy", "open"))]
    methods = [row[1] for row in rows]
    assert methods == ["none", "ngram", "ngram+prediction"] * 2
    assert all(row[-1] == "yes" for row in rows)  # greedy output unchanged by speculation
    header = next(i for i, line in enumerate(lines) if line.startswith("drafts"))
    costs = [line.split() for line in lines[header + 1 :]]
    assert [row[0] for row in costs] == ["0", "1", "2", "3"] and costs[0][2] == "1.00x"


def test_the_verification_timing_verifies_as_many_drafts_as_it_says(tiny_llama_dir):
    from spyglass.core.cli.bench.verify_cost import verification_costs
    from spyglass.core.engine.config import EngineConfig
    from spyglass.core.engine.engine import LLMEngine
    from spyglass.core.engine.hookspecs import hookimpl

    config = EngineConfig(
        model=str(tiny_llama_dir),
        dtype="float32",
        speculative="ngram",
        num_speculative_tokens=3,
        num_kv_blocks=32,
        block_size=8,
    )
    engine = LLMEngine(config)

    class Verified:
        def __init__(self):
            self.drafts = []

        @hookimpl
        def spyglass_drafts_verified(self, request, num_draft_tokens, num_accepted_tokens):
            self.drafts.append(num_draft_tokens)

    verified = Verified()
    engine.plugin_manager.register(verified)
    costs = verification_costs(engine, [5, 6, 7, 8], max_drafts=3, rounds=1, steps=4)
    assert sorted(costs) == [0, 1, 2, 3] and all(seconds > 0 for seconds in costs.values())
    assert set(verified.drafts) == {1, 2, 3}  # steps of L = 0 propose nothing, so verify nothing
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks  # every block returned
    assert not engine.has_unfinished_requests


def test_bench_latency_verify_cost_needs_a_proposer(tiny_llama_dir, capsys):
    argv = ["bench", "latency", "--model", str(tiny_llama_dir), *TINY, "--verify-cost"]
    assert run(argv) == 2
    assert "--speculative" in capsys.readouterr().err


def test_bench_startup_times_servers_until_ready_and_stops_them(tiny_llama_dir, capsys):
    argv = ["bench", "startup", "--repeats", "1", "--", "--model", str(tiny_llama_dir), *TINY]
    assert run(argv) == 0
    first, quick = capsys.readouterr().out.splitlines()
    assert first.startswith("spyglass serve until /ready: first start ") and "median" in first
    assert quick.startswith("answered in: spyglass --help ") and "spyglass plugins " in quick


def test_bench_startup_reports_a_server_that_cannot_start(tmp_path, capsys):
    argv = ["bench", "startup", "--repeats", "1", "--", "--model", str(tmp_path / "missing")]
    assert run(argv) == 1
    assert "spyglass serve exited with" in capsys.readouterr().err


def test_bench_steps_splits_decode_steps_into_phases_per_batch(tiny_llama_dir, capsys):
    runs = {"--async-output": ["delta"], "--no-async-output": ["cumulative", "final-only"]}
    for overlap, kinds in runs.items():
        argv = ["bench", "steps", "--model", str(tiny_llama_dir), *TINY, "--batches", "1,4",
                "--prompt-len", "8", "--max-tokens", "12", overlap]  # fmt: skip
        if kinds != ["delta"]:  # the default
            argv += ["--output-kinds", ",".join(kinds)]
        assert run(argv) == 0
        header, columns, *rows = capsys.readouterr().out.splitlines()
        assert f"async output {'on' if overlap == '--async-output' else 'off'}" in header
        assert columns.split() == ["batch", "outputs", "step", *step_phases.PHASES, "graphed"]
        assert [row.split()[:2] for row in rows] == [[b, k] for b in ("1", "4") for k in kinds]
        for row in rows:
            assert row.split()[-1] == "0%"  # no CUDA graphs on the CPU
            step, *phases = map(float, row.split()[2:-1])
            # The phases are parts of a step; the model runs inside launch on the CPU.
            assert all(value >= 0 for value in phases) and phases[2] > 0
            assert sum(phases) <= 1.5 * step
    assert run(["bench", "steps", "--model", str(tiny_llama_dir), "--output-kinds", "part"]) == 2
    assert (
        "--output-kinds takes cumulative, delta, final-only, first-and-final; got 'part'"
        in capsys.readouterr().out
    )


def test_bench_steps_counts_the_decode_steps_that_replayed_graphs(tiny_llama_dir, eager_graphs):
    # Graphs replayed eagerly on the CPU (`EagerReplay`): every decode step of a batch within the
    # buckets is graphed, and none once the runner has no graphs.
    from spyglass.core.engine.config import EngineConfig
    from spyglass.core.engine.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", max_num_seqs=4))
    graphs = eager_graphs(engine)
    assert step_phases.phase_medians(engine, 3, 8, 10)["graphed"] == 1.0
    assert {shape.kind for shape in graphs.replayed} == {"decode"}
    engine.runner.graphs = None
    assert step_phases.phase_medians(engine, 3, 8, 10)["graphed"] == 0.0
    engine.shutdown()


def test_bench_steps_samples_as_asked(tiny_llama_dir, capsys):
    argv = ["bench", "steps", "--model", str(tiny_llama_dir), *TINY, "--batches", "2",
            "--prompt-len", "8", "--max-tokens", "8"]  # fmt: skip
    sampling = {"temperature": 0.8, "top_p": 0.9, "seed": 3}
    assert run([*argv, "--sampling", json.dumps(sampling)]) == 0
    header, _, row = capsys.readouterr().out.splitlines()
    assert f"sampling {sampling}" in header and row.split()[:2] == ["2", "delta"]
    assert run([*argv, "--sampling", '{"top_p": 2}']) == 2
    assert "--sampling: top_p must be in (0, 1]" in capsys.readouterr().out


def test_bench_steps_times_the_deferred_sampling_of_grammars(tiny_llama_dir, capsys):
    """With async scheduling a grammar's steps are sampled after the commit before (deferred);
    in turn they are sampled at launch."""
    argv = ["bench", "steps", "--model", str(tiny_llama_dir), *TINY, "--batches", "3",
            "--prompt-len", "8", "--max-tokens", "10"]  # fmt: skip
    grammar = {"structured_output": {"kind": "regex", "value": "[a-z]{10,60}"}}
    deferred = {}
    for mode in ("--async-scheduling", "--no-async-scheduling"):
        assert run([*argv, mode, "--sampling", json.dumps(grammar)]) == 0
        header, columns, row = capsys.readouterr().out.splitlines()
        assert "StructuredOutput(kind='regex'" in header
        deferred[mode] = float(row.split()[columns.split().index("deferred")])
    assert deferred["--async-scheduling"] > 0 and deferred["--no-async-scheduling"] == 0
    assert run([*argv, "--sampling", '{"structured_output": "json"}']) == 2
    assert "--sampling: structured_output is an object" in capsys.readouterr().out


def test_bench_throughput_compares_lora_runs(tiny_llama_dir, capsys):
    argv = ["bench", "throughput", "--model", str(tiny_llama_dir), *TINY, "--workloads", "w1", "--num-requests", "3",
            "--repeats", "1", "--compare-lora", "1,2", "--max-lora-rank", "4"]  # fmt: skip
    assert run(argv) == 0
    rows = {
        line.split()[0]: line.split()
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("fcfs", "lora-"))
    }
    assert set(rows) == {"fcfs", "lora-x1", "lora-x2"} and rows["fcfs"][-1] == "1.00x"


def test_the_bench_random_adapter_is_one_peft_reads_and_runs_alike(tiny_llama_dir, tmp_path):
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from spyglass import LLM, LoRARequest, SamplingParams
    from spyglass.core.cli.bench.random_lora import write_random_lora

    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory="16MiB", enable_lora=True,
              max_lora_rank=4, plugins=["fcfs"])  # fmt: skip
    try:
        path = write_random_lora(tmp_path / "adapter", llm.engine.arch, rank=4, seed=3)
        prompt = [1, 450, 4996, 17354, 1701]
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        [ours] = llm.generate(
            {"prompt_token_ids": prompt}, params, use_tqdm=False,
            lora_request=LoRARequest("random", 1, str(path)),
        )  # fmt: skip
        [base] = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    finally:
        torch.set_flush_denormal(False)  # the engine set it on this thread; hypothesis needs it off
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(model, path)
    with torch.no_grad():
        out = adapted.generate(
            torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False
        )
    assert ours.outputs[0].token_ids == out[0, len(prompt) :].tolist()
    assert ours.outputs[0].token_ids != base.outputs[0].token_ids  # the delta is not negligible
