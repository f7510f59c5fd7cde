"""``spyglass run-batch``: a file of requests in OpenAI's batch format answered offline, line for
line in the input's order, each as ``spyglass serve`` answers it (the same greedy text), bad
lines reported in their own output line without stopping the others."""

import asyncio
import io
import json
import socket
import subprocess
import sys

import httpx
from litestar import Litestar, post
from litestar.response import Stream

from spyglass.core.api.batch_file import run_batch

GREEDY_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
GREEDY_TEXT = {"prompt": "Once upon", "max_tokens": 6, "temperature": 0}


def _run_batch(model, tmp_path, lines: list, *extra: str) -> subprocess.CompletedProcess:
    source, sink = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(
        "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    )
    command = [sys.executable, "-m", "spyglass.core.cli.main", "run-batch", str(model)]
    command += ["--served-model-name", "tiny", "--num-threads", "1", "--kv-cache-memory", "64MiB"]
    command += ["-i", str(source), "-o", str(sink), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def _request(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def test_each_line_is_answered_as_the_server_answers_it(tiny_llama_dir, tiny_server, tmp_path):
    lines = [
        _request("chat", "/v1/chat/completions", GREEDY_CHAT),
        _request("text", "/v1/completions", GREEDY_TEXT),
        _request("empty", "/v1/chat/completions", {"messages": [], "max_tokens": 2}),
        "not json",
        _request("embed", "/v1/embeddings", {"input": "hello"}),
        {"custom_id": "get", "method": "GET", "url": "/v1/models"},
        _request("streamed", "/v1/completions", GREEDY_TEXT | {"stream": True}),
    ]
    done = _run_batch(tiny_llama_dir, tmp_path, lines)
    assert done.returncode == 0, done.stderr
    assert "3 succeeded, 1 failed, 3 not sent" in done.stderr
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in out] == [
        "chat", "text", "empty", None, "embed", "get", "streamed",
    ]  # fmt: skip
    assert all(line["id"].startswith("batch_req_") for line in out)
    chat, text, empty, garbled, embed, get, streamed = out
    # The server's answers to the same bodies: the same greedy text.
    served = httpx.post(f"{tiny_server.base_url}/v1/chat/completions", json=GREEDY_CHAT).json()
    assert chat["response"]["status_code"] == 200 and chat["error"] is None
    assert (
        chat["response"]["body"]["choices"][0]["message"]["content"]
        == (served["choices"][0]["message"]["content"])
    )
    assert chat["response"]["request_id"]
    served = httpx.post(f"{tiny_server.base_url}/v1/completions", json=GREEDY_TEXT).json()
    assert text["response"]["body"]["choices"][0]["text"] == served["choices"][0]["text"]
    assert len(embed["response"]["body"]["data"][0]["embedding"]) > 0
    # A bad body is the API's 4xx, in its line; a line that cannot be sent says why.
    assert empty["response"]["status_code"] == 400
    assert empty["response"]["body"]["error"]["param"] == "messages"
    for line, reason in ((garbled, "not JSON"), (get, "only POST"), (streamed, "streamed")):
        assert line["response"] is None and reason in line["error"]["message"]


def test_many_lines_keep_their_order_under_a_concurrency_limit(tiny_llama_dir, tmp_path):
    lines = [
        _request(f"n{i}", "/v1/completions", GREEDY_TEXT | {"max_tokens": 1 + i % 7})
        for i in range(40)
    ]
    done = _run_batch(tiny_llama_dir, tmp_path, lines, "--max-concurrency", "4")
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in out] == [f"n{i}" for i in range(40)]
    usage = [line["response"]["body"]["usage"]["completion_tokens"] for line in out]
    assert all(tokens <= 1 + i % 7 for i, tokens in enumerate(usage))


def test_a_model_that_cannot_load_is_one_line(tmp_path):
    done = _run_batch(tmp_path / "no-model", tmp_path, [_request("a", "/v1/completions", {})])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("spyglass run-batch: Cannot load model")


def test_stdin_to_stdout(tiny_llama_dir):
    lines = [_request(f"s{i}", "/v1/completions", GREEDY_TEXT) for i in range(3)]
    command = [sys.executable, "-m", "spyglass.core.cli.main", "run-batch", str(tiny_llama_dir)]
    command += ["--num-threads", "1", "--kv-cache-memory", "64MiB", "-i", "-", "-o", "-"]
    stdin = "\n".join(json.dumps(line) for line in lines)
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["custom_id"] for line in out] == ["s0", "s1", "s2"]
    assert len({line["response"]["body"]["choices"][0]["text"] for line in out}) == 1  # greedy


def test_metrics_are_served_while_the_batch_runs(tiny_llama_dir, tmp_path, wait_for):
    # One long answer keeps the batch going while Prometheus' scrape would come.
    long = GREEDY_TEXT | {"max_tokens": 3000, "ignore_eos": True}
    source, sink = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps(_request("long", "/v1/completions", long)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "spyglass.core.cli.main", "run-batch", str(tiny_llama_dir)]
    command += [
        "--num-threads",
        "1",
        "--kv-cache-memory",
        "64MiB",
        "-i",
        str(source),
        "-o",
        str(sink),
    ]
    command += ["--enable-metrics", "--port", str(port)]
    batch = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:

        def running() -> bool:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.TransportError:
                return False
            return any(
                line.startswith("spyglass:num_requests_running{") and line.endswith(" 1.0")
                for line in text.splitlines()
            )

        wait_for(running, timeout=120)
        assert batch.wait(timeout=300) == 0, batch.stderr.read()
    finally:
        batch.kill()
    (line,) = [json.loads(text) for text in sink.read_text().splitlines()]
    assert line["response"]["body"]["usage"]["completion_tokens"] == 3000
    # The port is taken by then no more: the batch stopped serving when it ended.
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def test_a_line_whose_call_breaks_is_reported_and_the_others_go_on():
    # An app whose answer breaks after it began (past the API's error handling).
    @post("/v1/breaks")
    async def breaks() -> Stream:
        async def chunks():
            yield b"{"
            raise RuntimeError("the answer broke")

        return Stream(chunks())

    @post("/v1/works")
    async def works() -> dict:
        return {"ok": True}

    lines = [json.dumps(_request(name, f"/v1/{name}", {})) for name in ("breaks", "works")]
    out = io.StringIO()
    summary = asyncio.run(run_batch(Litestar([breaks, works]), lines, out))
    broke, worked = [json.loads(line) for line in out.getvalue().splitlines()]
    assert broke["response"] is None and broke["error"]["message"].startswith("the request failed")
    assert broke["error"]["code"] == "server_error"
    assert worked["response"] == {"status_code": 201, "request_id": worked["response"]["request_id"],
                                  "body": {"ok": True}}  # fmt: skip
    assert (summary.succeeded, summary.failed, summary.not_sent) == (1, 0, 1)
