"""A server on a model whose generation_config.json sets sampling defaults (vLLM's
``--generation-config auto``): requests that leave a setting out get the model's; requests
that give it keep theirs; ``--generation-config vllm`` serves the API's own defaults."""

import json
import shutil

import openai
import pytest

from tests.api.conftest import start_tiny

# Greedy and 5 tokens at most when a request says nothing.
GENERATION_CONFIG = {"temperature": 0.0, "max_new_tokens": 5}


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir, tmp_path_factory):
    path = shutil.copytree(tiny_llama_dir, tmp_path_factory.mktemp("generation") / "model")
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return path


@pytest.fixture(scope="module", params=["auto", "vllm"])
def client(request, model_dir, tmp_path_factory):
    options = ["--generation-config", request.param, "--dtype", "float32"]
    server = start_tiny("thread", model_dir, tmp_path_factory.mktemp("server"), *options)
    yield (
        request.param,
        openai.OpenAI(
            base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
        ),
    )
    server.stop()


def test_requests_that_leave_settings_out_get_the_models_defaults(client):
    source, openai_client = client
    messages = [{"role": "user", "content": "Tell me about foxes."}]
    # Without the model's max_new_tokens, a request with no max_tokens runs to the context's end.
    cap = {"max_tokens": 12} if source == "vllm" else {}
    cap["extra_body"] = {"ignore_eos": True}
    chats = [
        openai_client.chat.completions.create(model="tiny", messages=messages, seed=seed, **cap)
        for seed in (1, 2)
    ]
    completion = openai_client.completions.create(
        model="tiny", prompt="Foxes are", extra_body={"ignore_eos": True}
    )
    given = openai_client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=7, temperature=1.0, seed=3
    )
    assert given.usage.completion_tokens == 7  # a given setting is the request's own
    if source == "auto":
        # Greedy whatever the seed, and cut at 5 tokens (completions: not OpenAI's 16).
        assert [c.usage.completion_tokens for c in chats] == [5, 5]
        assert chats[0].choices[0].message.content == chats[1].choices[0].message.content
        assert chats[0].choices[0].finish_reason == "length"
        assert completion.usage.completion_tokens == 5
    else:
        assert completion.usage.completion_tokens == 16
        assert [c.usage.completion_tokens for c in chats] == [12, 12]


def test_responses_run_with_and_report_the_models_defaults(client):
    source, openai_client = client
    response = openai_client.responses.create(
        model="tiny",
        input="Tell me about foxes.",
        max_output_tokens=None if source == "auto" else 6,
    )
    assert response.temperature == (0.0 if source == "auto" else 1.0)
    assert response.usage.output_tokens == (5 if source == "auto" else 6)
