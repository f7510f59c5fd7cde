"""OpenAI's ``service_tier`` on a server whose policy orders by priority (``--policy priority``):
a ``priority`` call is admitted ahead of the default tier and a ``flex`` one after it; elsewhere those tiers are 400s
naming the field. Through the ``openai`` client (the span: tests/telemetry/test_answer_tracing.py)."""

import threading

import httpx
import openai
import pytest

from tests.api.conftest import TINY_ARGS

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}


def test_tiers_need_a_policy_that_orders_by_priority(tiny_server):
    client = openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0)
    for tier in ("flex", "priority"):
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(service_tier=tier, max_tokens=2, **CHAT)
        assert error.value.body["param"] == "service_tier"
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(model="tiny", input="Hi", service_tier=tier)
        assert error.value.body["param"] == "service_tier"
    # The default tier is every server's.
    default = client.chat.completions.create(service_tier="auto", max_tokens=2, **CHAT)
    assert default.service_tier == "default"


def test_priority_is_admitted_ahead_of_flex(server_factory, tiny_llama_dir, wait_for):
    server = server_factory(
        str(tiny_llama_dir), *TINY_ARGS, "--policy", "priority", "--max-num-seqs", "1"
    )
    url, finished, lock = f"{server.base_url}/v1/chat/completions", [], threading.Lock()

    def ask(name: str, tier: str | None, max_tokens: int) -> None:
        body = CHAT | {"max_tokens": max_tokens, "ignore_eos": True}
        reply = httpx.post(url, json=body | ({"service_tier": tier} if tier else {}), timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json().get("service_tier") == tier
        with lock:
            finished.append(name)

    def waiting() -> int:
        requests = httpx.get(f"{server.base_url}/debug/requests", timeout=10).json()
        return sum(request["status"] == "waiting" for request in requests)

    # One sequence at a time: a long default answer runs while a flex one waits, then a
    # priority one arrives; it is admitted before the flex one that came first.
    threads = [threading.Thread(target=ask, args=("default", None, 3000))]
    threads[0].start()
    wait_for(lambda: httpx.get(f"{server.base_url}/debug/requests", timeout=10).json())
    threads.append(threading.Thread(target=ask, args=("flex", "flex", 4)))
    threads[1].start()
    wait_for(lambda: waiting() == 1)
    threads.append(threading.Thread(target=ask, args=("priority", "priority", 4)))
    threads[2].start()
    wait_for(lambda: waiting() == 2)  # both queued behind the running one, at their priorities
    queue = httpx.get(f"{server.base_url}/debug/requests", timeout=10).json()
    assert sorted(request["priority"] for request in queue) == [-1, 0, 1]
    for thread in threads:
        thread.join(timeout=180)
    assert finished == ["default", "priority", "flex"]
