"""Structured request logs: one JSON line per finished request, joined to its trace, content opt-in."""

import io
import json
import logging
import subprocess
import sys

import pytest

from spyglass.core.engine.answer_reading import AnswerReading
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.telemetry.logging import setup_logging
from tests.telemetry.test_answer_tracing import ANSWER, WEATHER, BrokenParsers, written

PROMPT = "a secret prompt"


def lines(stream, event):
    return [r for r in map(json.loads, stream.getvalue().splitlines()) if r["event"] == event]


@pytest.mark.parametrize("log_content", [False, True])
def test_one_summary_line_per_request_with_trace_ids(
    log_stream, use_settings, span_exporter, make_engine, run_to_completion, log_content
):
    use_settings(log_content=log_content)
    engine = make_engine()
    prompt_ids = engine.tokenizer.encode(PROMPT)
    engine.add_request("r1", prompt_ids, SamplingParams(max_tokens=4, ignore_eos=True), PROMPT)
    outputs = run_to_completion(engine)
    (record,) = lines(log_stream, "request finished")
    (span,) = [
        s for s in span_exporter.get_finished_spans() if s.name.startswith("text_completion")
    ]
    assert (
        record["req_id"] == "r1"
        and record["level"] == "info"
        and record["logger"] == "spyglass.requests"
    )
    assert record["trace_id"] == format(span.context.trace_id, "032x")
    assert record["span_id"] == format(span.context.span_id, "016x")
    assert (record["finish_reason"], record["prompt_tokens"], record["output_tokens"]) == (
        "length",
        len(prompt_ids),
        4,
    )
    assert 0 <= record["queue_s"] <= record["ttft_s"] <= record["e2e_s"] and record["tpot_s"] > 0
    assert record["prefill_s"] >= 0 and record["decode_s"] >= 0
    if log_content:
        assert record["prompt"] == PROMPT and record["output"] == outputs["r1"].outputs[0].text
    else:
        assert (
            PROMPT not in log_stream.getvalue()
            and "prompt" not in record
            and "output" not in record
        )


def test_console_rendering_and_lines_without_a_trace(use_settings, make_engine, run_to_completion):
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        setup_logging(logging.INFO, json=False, stream=stream)
        use_settings(tracing=False)
        engine = make_engine()
        engine.add_request("r2", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
        run_to_completion(engine)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    text = stream.getvalue()
    assert "request finished" in text and "req_id" in text and not text.lstrip().startswith("{")


def test_cli_commands_log_json_to_stderr_and_keep_stdout(tiny_llama_dir):
    """Every command goes through the same `setup_logging` (cli.main); ``generate`` stands for them."""
    command = [
        sys.executable,
        "-m",
        "spyglass.core.cli.main",
        "generate",
        "Hello",
        "--model",
        str(tiny_llama_dir),
    ]
    command += ["--max-tokens", "3", "--dtype", "float32", "--num-threads", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert all({"timestamp", "level", "logger", "event"} <= r.keys() for r in records)
    (finished,) = [r for r in records if r["event"] == "request finished"]
    assert (
        finished["req_id"] == "cli"
        and finished["output_tokens"] == 3
        and finished["request_id"] == ""
    )
    assert (
        "request finished" not in result.stdout and "engine started" not in result.stdout
    )  # the completion only


def test_an_answers_tool_calls_are_counted_on_its_line(
    log_stream, use_settings, make_engine, run_to_completion
):
    use_settings()
    engine = make_engine()
    reading = AnswerReading(reasoning_parser="qwen3", tool_call_parser="hermes")
    chat = {"operation": "chat", "tools": [WEATHER], "answer_reading": reading}
    written(engine, "called", ANSWER, chat)
    written(engine, "plain", ANSWER, {"operation": "chat"})  # an answer the API does not split
    run_to_completion(engine)
    records = {r["req_id"]: r for r in lines(log_stream, "request finished")}
    assert records["called"]["tool_calls"] == 1 and "tool_calls" not in records["plain"]
    assert "output" not in records["called"]  # the count needs no content opt-in


def test_an_answer_the_parser_fails_on_keeps_its_line(
    log_stream, use_settings, make_engine, run_to_completion
):
    use_settings()
    engine = make_engine()
    engine.plugin_manager.register(BrokenParsers())
    reading = AnswerReading(tool_call_parser="broken")
    written(engine, "broken", ANSWER, {"operation": "chat", "answer_reading": reading})
    run_to_completion(engine)
    (record,) = lines(log_stream, "request finished")
    assert record["read_error"] == "KeyError" and "tool_calls" not in record
