"""``use_beam_search`` over HTTP with the official client: completions and chat answer the ``n``
beams transformers' beam search finds, and fields beam search cannot honour are 400s naming them."""

import httpx
import openai
import pytest

from tests.api.conftest import LAYOUTS, start_tiny

PROMPT = "The old lighthouse"


@pytest.fixture(scope="module", params=LAYOUTS)
def server(request, tiny_llama_dir, tmp_path_factory):
    """The tiny model in float32, as the reference computes it (beams rank by close scores), in
    either layout."""
    log_dir = tmp_path_factory.mktemp("beams")
    started = start_tiny(request.param, tiny_llama_dir, log_dir, "--dtype", "float32")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


BEAMS = {"use_beam_search": True, "ignore_eos": True}


def test_completions_return_the_beams_best_first(client, hf_gguf_tokenizer, hf_beams):
    response = client.completions.create(
        model="tiny", prompt=[PROMPT, "A quiet"], n=3, max_tokens=5, extra_body=BEAMS
    )
    assert [c.index for c in response.choices] == list(range(6))
    for index, prompt in enumerate([PROMPT, "A quiet"]):
        token_ids = hf_gguf_tokenizer(prompt).input_ids
        expected = [hf_gguf_tokenizer.decode(t) for t in hf_beams(token_ids, 3, 5)]
        assert [c.text for c in response.choices[3 * index : 3 * index + 3]] == expected
    assert {c.finish_reason for c in response.choices} == {"length"}
    assert response.usage.completion_tokens == 6 * 5


def test_chat_returns_the_beams_of_the_answer(client, server, hf_beams):
    messages = [{"role": "user", "content": "Name a colour."}]
    response = client.chat.completions.create(
        model="tiny", messages=messages, n=2, max_tokens=4, temperature=0, extra_body=BEAMS
    )
    prompt = httpx.post(f"{server.base_url}/tokenize", json={"messages": messages}).json()
    assert response.usage.prompt_tokens == prompt["count"]
    tokenizer_url = f"{server.base_url}/detokenize"
    expected = [
        httpx.post(tokenizer_url, json={"tokens": t}).json()["prompt"]
        for t in hf_beams(prompt["tokens"], 2, 4)
    ]
    assert [c.message.content for c in response.choices] == expected


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": True}, "stream"),
        ({"temperature": 0.7}, "temperature"),
        ({"top_p": 0.5}, "top_p"),
        ({"stop": ["x"]}, "stop"),
        ({"logprobs": 2}, "logprobs"),
        ({"n": 11}, "n"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_what_beam_search_cannot_honour_is_a_400_naming_it(client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=4, extra_body={**BEAMS, **extra}
        )
    assert error.value.body["param"] == param


def test_length_penalty_needs_beam_search(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=4, extra_body={"length_penalty": 0.5}
        )
    assert error.value.body["param"] == "length_penalty"
