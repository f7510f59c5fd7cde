"""``spyglass serve --engine-process``: the engine in a child process answers exactly as in a thread,
its metrics reach ``/metrics`` beside the server's own, and its death takes the server down cleanly."""

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import TINY_ARGS


@pytest.fixture
def process_server(tiny_process_server):
    return tiny_process_server


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def _engine_pid(server) -> int:
    children = subprocess.run(
        ["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True, check=True
    ).stdout.split()
    for pid in children:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"spawn_main" in cmdline.read():  # not the resource tracker
                return int(pid)
    pytest.fail(f"no engine process among {children}")


def _rest_of_stream(server, body: dict, meanwhile) -> list[str]:
    """Stream a completion, call ``meanwhile()`` after its first event, return the lines after it."""
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{server.base_url}/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            meanwhile()
            return list(lines)


def _answers(client: openai.OpenAI) -> list:
    messages = [{"role": "user", "content": "Name three rivers"}]
    greedy = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=24, temperature=0.0
    )
    seeded = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=24, temperature=0.9, seed=7, n=2
    )
    streamed = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=24,
        temperature=0.0,
        stream=True,
        logprobs=True,
        top_logprobs=2,
    )
    chunks = list(streamed)
    stream_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    stream_logprobs = [
        (t.token, round(t.logprob, 4))
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    return [
        greedy.choices[0].message.content,
        (greedy.usage.prompt_tokens, greedy.usage.completion_tokens),  # cache hits vary
        [c.text for c in seeded.choices],
        seeded.usage.completion_tokens,
        stream_text,
        stream_logprobs,
    ]


def test_answers_match_the_engine_in_a_thread(process_server, tiny_server):
    in_process = _answers(_client(tiny_server))
    assert _answers(_client(process_server)) == in_process
    assert in_process[4] == in_process[0] and len(in_process[5]) == 24
    assert _engine_pid(process_server) != process_server.process.pid


def test_a_rejected_request_is_a_400_naming_its_field(process_server):
    response = httpx.post(
        f"{process_server.base_url}/v1/completions",
        json={"prompt": "hi", "max_tokens": 10**6},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"


def test_metrics_come_from_the_engine_process_and_the_server(process_server):
    client = _client(process_server)
    for _ in range(2):
        client.completions.create(model="tiny", prompt="hi", max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="hi", extra_body={"max_token": 3})
    text = httpx.get(f"{process_server.base_url}/metrics", timeout=30).text
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a metric family exported twice"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples
    }

    def value(name, **labels):
        return sum(
            v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()
        )

    # Recorded by the engine's plugins, in the engine process.
    assert value("spyglass:request_success_total", finished_reason="length") >= 2
    assert value("spyglass:generation_tokens_total") >= 6
    assert value("spyglass:num_requests_running") == 0
    # Recorded by the HTTP middleware, in the server process.
    assert value("spyglass:http_requests_total", route="/v1/completions", status="200") >= 2
    assert value("spyglass:http_errors_total", code="unknown_parameter") >= 1


def test_the_metrics_say_where_the_engine_runs(process_server, tiny_server):
    for server, placement in ((process_server, "process"), (tiny_server, "thread")):
        text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
        (family,) = (
            f
            for f in text_string_to_metric_families(text)
            if f.name == "spyglass:server_config_info"
        )
        assert [(s.labels, s.value) for s in family.samples] == [
            (
                {
                    "engine_placement": placement,
                    "tool_call_parser": "hermes",
                    "reasoning_parser": "none",
                },
                1.0,
            )
        ]


def test_an_engine_process_that_dies_stops_the_server_with_an_error(tiny_llama_dir, server_factory):
    server = server_factory(str(tiny_llama_dir), *TINY_ARGS, "--engine-process")
    body = {"prompt": "Tell me everything", "max_tokens": 12000, "ignore_eos": True, "stream": True}
    # The stream ends, with an error event, instead of hanging.
    rest = "\n".join(
        _rest_of_stream(server, body, lambda: os.kill(_engine_pid(server), signal.SIGKILL))
    )
    assert '"error"' in rest and "engine" in rest
    assert server.process.wait(30) == 1
    assert "engine process failed" in server.log()


def test_sigterm_drains_through_the_engine_process(tiny_llama_dir, server_factory):
    """Signals to the whole process group (Ctrl-C, systemd) leave the engine process to the server,
    which drains it: the stream in flight completes."""
    server = server_factory(str(tiny_llama_dir), *TINY_ARGS, "--engine-process")
    engine_pid = _engine_pid(server)

    def signal_everyone():
        os.kill(engine_pid, signal.SIGINT)
        os.kill(engine_pid, signal.SIGTERM)
        server.process.send_signal(signal.SIGTERM)

    body = {"prompt": "Count", "max_tokens": 40, "ignore_eos": True, "stream": True}
    rest = [line for line in _rest_of_stream(server, body, signal_everyone) if line]
    assert rest[-1] == "data: [DONE]" and not any('"error"' in line for line in rest)
    assert '"finish_reason":"length"' in rest[-2]
    assert server.process.wait(60) == 0
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{engine_pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{engine_pid}"), "the engine process outlived the server"


def test_engine_process_and_replicas_are_refused_together():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "spyglass.core.cli.main",
            "serve",
            "--engine-process",
            "--replicas",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "--engine-process and --replicas" in result.stderr


def test_constrained_decoding_runs_in_the_engine_process(process_server):
    choices = ["lighthouse", "harbour", "cliff"]
    completion = _client(process_server).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Pick one"}],
        max_tokens=16,
        extra_body={"guided_choice": choices},
    )
    assert completion.choices[0].message.content in choices


def test_the_engine_process_ends_when_the_server_is_killed(tiny_llama_dir, server_factory):
    server = server_factory(str(tiny_llama_dir), *TINY_ARGS, "--engine-process")
    engine_pid = _engine_pid(server)
    server.process.kill()
    server.process.wait(10)
    deadline = time.monotonic() + 30
    while _running(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(engine_pid), "the engine process outlived a killed server"


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting for its (dead) parent's reaper."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    "flags,device,own_process",
    [
        ([], "cuda", True),
        ([], "cpu", False),
        (["--engine-process"], "cpu", True),
        (["--no-engine-process"], "cuda", False),
    ],
)
def test_the_engine_gets_its_own_process_by_default_on_cuda_only(flags, device, own_process):
    from spyglass.core.api.engine_placement import in_own_process
    from spyglass.core.cli.main import build_parser
    from spyglass.core.cli.serve_command import server_options_from_args
    from spyglass.core.engine.config import EngineConfig

    argv = ["serve", *flags]
    args = build_parser(argv).parse_args(argv)
    options = server_options_from_args(args)
    assert in_own_process(options, EngineConfig(device=device)) is own_process
