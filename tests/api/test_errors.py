"""Bad input gets an OpenAI-shaped 4xx, never a 500 or a hang, and the server keeps serving."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

# (path, raw body or JSON object, status, param)
BAD_INPUTS = [
    (COMPLETIONS, b'{"prompt": "hi", ', 400, None),
    (COMPLETIONS, b"not json at all", 400, None),
    (COMPLETIONS, [1, 2], 400, None),
    (COMPLETIONS, {}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    (COMPLETIONS, {"prompt": 42}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "temperature": -0.1}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n"),
    (COMPLETIONS, {"prompt": "hi", "seed": 2**70}, 400, "seed"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 10**6, "stream": True}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[]]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [True, 2]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, 400, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "image_url"),
    (CHAT, {"messages": USER, "model": "nope"}, 404, "model"),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    (CHAT, {"messages": USER, "temperature": -1, "stream": True}, 400, "temperature"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": USER, "max_tokens": 10**6}, 400, "max_tokens"),
    # OpenAI's fields that this server does not honour: never a 200 that pretends.
    (CHAT, {"messages": USER, "modalities": ["text", "audio"]}, 400, "modalities"),
    (CHAT, {"messages": USER, "audio": {"voice": "alloy", "format": "wav"}}, 400, "audio"),
    (
        CHAT,
        {"messages": USER, "prediction": {"type": "content", "content": "x"}},
        400,
        "prediction",
    ),
    (CHAT, {"messages": USER, "web_search_options": {}}, 400, "web_search_options"),
    (CHAT, {"messages": USER, "verbosity": "low"}, 400, "verbosity"),
    (CHAT, {"messages": USER, "service_tier": "priority"}, 400, "service_tier"),
    (CHAT, {"messages": USER, "reasoning_effort": "high"}, 400, "reasoning_effort"),
    (CHAT, {"messages": USER, "metadata": {"k": "v" * 513}}, 400, "metadata"),
    (CHAT, {"messages": USER, "metadata": {str(i): "v" for i in range(17)}}, 400, "metadata"),
    (COMPLETIONS, {"prompt": "hi", "metadata": {"k" * 65: "v"}}, 400, "metadata"),
    (CHAT, {"messages": USER, "prompt_cache_retention": "24h"}, 400, "prompt_cache_retention"),
    (CHAT, {"messages": USER, "prompt_cache_options": {"ttl": "30m"}}, 400, "prompt_cache_options"),
    (CHAT, {"messages": USER, "moderation": {"model": "omni"}}, 400, "moderation"),
    (
        CHAT,
        {"messages": USER, "stream_options": {"include_obfuscation": True}},
        400,
        "stream_options",
    ),
    (CHAT, {"messages": USER, "safety_identifier": ""}, 400, "safety_identifier"),
    # A field this server does not know is refused by name, as OpenAI does: a typo never passes.
    (CHAT, {"messages": USER, "max_token": 5}, 400, "max_token"),
    (COMPLETIONS, {"prompt": "hi", "guided_jsn": {}}, 400, "guided_jsn"),
    ("/v1/responses", {"input": "hi", "temprature": 0.2}, 400, "temprature"),
    ("/v1/embeddings", {"input": "hi", "dimension": 8}, 400, "dimension"),
    ("/tokenize", {"prompt": "hi", "add_bos": True}, 400, "add_bos"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_INPUTS)
def test_bad_input_gets_openai_error(tiny_server, path, body, status, param):
    url = tiny_server.base_url + path
    with httpx.Client(timeout=30) as client:
        if isinstance(body, bytes):
            response = client.post(url, content=body, headers={"content-type": "application/json"})
        else:
            response = client.post(url, json=body)
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert error["param"] == param
        # The server is still fine.
        assert client.get(f"{tiny_server.base_url}/health").status_code == 200


def test_oversized_body_gets_413(tiny_server):
    body = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    response = httpx.post(
        f"{tiny_server.base_url}{COMPLETIONS}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_route_and_method_are_openai_shaped(tiny_server):
    assert httpx.get(f"{tiny_server.base_url}/v1/nothing").json()["error"]["message"]
    response = httpx.get(f"{tiny_server.base_url}{COMPLETIONS}")
    assert response.status_code == 405 and "error" in response.json()


def test_model_may_be_omitted(tiny_server):
    response = httpx.post(
        f"{tiny_server.base_url}{COMPLETIONS}", json={"prompt": "hi", "max_tokens": 2}, timeout=30
    )
    assert response.status_code == 200 and response.json()["model"] == "tiny"


def test_neutral_values_of_fields_not_honoured_pass(tiny_client):
    # What OpenAI's clients send by default or mean by "nothing special" is a 200.
    chat = tiny_client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=2,
        store=False,
        modalities=["text"],
        service_tier="auto",
        metadata={"team": "search"},
        prompt_cache_retention="in_memory",
        prompt_cache_options={"mode": "implicit"},
    )
    assert chat.usage.completion_tokens == 2


def test_refused_fields_are_counted_by_their_error_code(tiny_server):
    # An operator sees how often clients send what the server refuses, and of which kind.
    def counted() -> dict[str, float]:
        text = httpx.get(f"{tiny_server.base_url}/metrics", timeout=30).text
        return {
            sample.labels["code"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "spyglass:http_errors_total"
            and sample.labels["route"] == CHAT
            and sample.labels["status"] == "400"
        }

    before = counted()
    for body in ({"max_token": 5}, {"verbosity": "low"}, {"max_token": 5}):
        response = httpx.post(f"{tiny_server.base_url}{CHAT}", json={"messages": USER, **body})
        assert response.status_code == 400
        if "max_token" in body:  # a near miss of a field gets a hint
            assert response.json()["error"]["message"] == (
                "Unrecognized request argument supplied: max_token (did you mean `max_tokens`?)"
            )
    after = counted()
    assert after["unknown_parameter"] - before.get("unknown_parameter", 0) == 2
    assert after["unsupported_parameter"] - before.get("unsupported_parameter", 0) == 1
