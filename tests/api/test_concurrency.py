"""Many clients at once, and clients that leave mid-stream: every request ends and frees its KV blocks."""

import asyncio
import json

import httpx
import openai
import pytest

from tests.api.conftest import TINY_ARGS, start_server


@pytest.fixture(scope="module", params=["in turn", "async scheduling", "engine process"])
def tiny_server(request, tiny_server, tiny_process_server, tiny_llama_dir, tmp_path_factory):
    """The shared tiny server, one that schedules each step before the previous one's tokens reach
    the host, and one whose engine runs in a process of its own: clients see the same protocol,
    and every request still ends and frees its blocks."""
    if request.param != "async scheduling":
        yield tiny_server if request.param == "in turn" else tiny_process_server
        return
    server = start_server(
        str(tiny_llama_dir),
        tmp_path_factory.mktemp("async_scheduling_server"),
        *TINY_ARGS,
        "--async-output",
        "--async-scheduling",
    )
    assert "async output on, async scheduling on" in server.log()
    yield server
    server.stop()


def _kv(server) -> dict:
    return httpx.get(f"{server.base_url}/debug/kv", timeout=10).json()


def _all_free(server) -> bool:
    stats = _kv(server)
    return stats["num_requests"] == 0 and stats["num_free_blocks"] == stats["num_blocks"]


def test_32_concurrent_streaming_clients(tiny_server, wait_for):
    client = openai.AsyncOpenAI(
        base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )

    async def one(i: int):
        stream = await client.completions.create(
            model="tiny",
            prompt=f"Request number {i}",
            max_tokens=8 + i,
            temperature=0.9,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, usage, finish = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        return i, text, usage, finish

    async def run_all():
        try:
            return await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            await client.close()

    results = asyncio.run(run_all())
    for i, text, usage, finish in results:
        assert finish == "length" and text
        assert usage.completion_tokens == 8 + i
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    wait_for(lambda: _all_free(tiny_server))


def test_disconnect_mid_stream_aborts_the_request(tiny_server, wait_for):
    body = {
        "model": "tiny",
        "prompt": "Tell me everything",
        "max_tokens": 12000,
        "stream": True,
        "ignore_eos": True,
        "n": 2,
    }
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{tiny_server.base_url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            events = 0
            for line in response.iter_lines():
                if line.startswith("data: "):
                    assert "error" not in json.loads(line[6:])
                    events += 1
                if events == 5:
                    assert _kv(tiny_server)["num_requests"] == 2
                    break
    # Closing the connection must abort both engine requests long before 12000 tokens.
    wait_for(lambda: _all_free(tiny_server), timeout=10)
    response = httpx.post(
        f"{tiny_server.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}
    )
    assert response.status_code == 200


def test_disconnect_of_a_chat_stream(tiny_server, wait_for):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 12000,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST", f"{tiny_server.base_url}/v1/chat/completions", json=body
        ) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
    wait_for(lambda: _all_free(tiny_server), timeout=10)


def test_debug_views_show_a_live_request_then_its_blocks_back(tiny_server, wait_for):
    # Long enough to be still generating when the debug views are read.
    body = {
        "model": "tiny",
        "prompt": "hello there",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{tiny_server.base_url}/v1/completions", json=body, timeout=60
    ) as stream:
        lines = stream.iter_lines()  # kept: a dropped iterator closes the response
        assert next(lines).startswith("data: ")
        [request] = httpx.get(f"{tiny_server.base_url}/debug/requests", timeout=10).json()
        assert request["status"] == "running" and request["num_prompt_tokens"] > 0
        assert (
            request["num_blocks"] > 0
            and request["num_computed_tokens"] >= request["num_prompt_tokens"]
        )
        assert _kv(tiny_server)["kv_usage"] > 0
    # The client went away: the request is aborted and its blocks return to the pool.
    wait_for(lambda: _all_free(tiny_server))
    assert _kv(tiny_server)["kv_usage"] == 0.0
    assert httpx.get(f"{tiny_server.base_url}/debug/requests", timeout=10).json() == []
