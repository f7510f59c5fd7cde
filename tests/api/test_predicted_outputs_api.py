"""OpenAI's predicted outputs over HTTP: the official client's ``prediction`` reaches n-gram
speculation, the answer is the one without it, and a server that cannot use it says so."""

import openai
import pytest

from tests.api.conftest import start_tiny

MESSAGES = [{"role": "user", "content": "Rewrite this function with a docstring."}]


@pytest.fixture(scope="module", params=["thread", "process"])
def speculating(request, tiny_llama_dir, tmp_path_factory):
    """A client of a server running n-gram speculation, its engine in a thread or a process (whose
    outputs cross a pipe as rows)."""
    server = start_tiny(
        request.param,
        tiny_llama_dir,
        tmp_path_factory.mktemp("predicted"),
        "--speculative",
        "ngram",
        "--num-speculative-tokens",
        "4",
    )
    yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    server.stop()


def _chat(client: openai.OpenAI, **options):
    return client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=32,
        temperature=0,
        extra_body={"ignore_eos": True},
        **options,
    )


def _answer(client: openai.OpenAI, **options) -> str:
    return _chat(client, **options).choices[0].message.content


def test_the_answer_is_the_same_with_a_prediction(speculating):
    plain = _answer(speculating)
    predicted = {"type": "content", "content": plain}
    chat = _chat(speculating, prediction=predicted)
    assert chat.choices[0].message.content == plain
    # Usage says how much of the prediction the answer took: nearly all of it here.
    details = chat.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= chat.usage.completion_tokens // 2
    assert details.rejected_prediction_tokens >= 0
    assert _chat(speculating).usage.completion_tokens_details is None
    parts = {
        "type": "content",
        "content": [{"type": "text", "text": plain[:10]}, {"type": "text", "text": plain[10:]}],
    }
    assert _answer(speculating, prediction=parts) == plain
    streamed = _chat(speculating, stream=True, prediction=predicted)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == plain


def test_a_prediction_that_would_change_nothing_is_a_400(speculating, tiny_client):
    predicted = {"type": "content", "content": "def f(x):\n    return x\n"}
    refusals = [
        (tiny_client, {}, "--speculative ngram"),  # this server does not speculate
        (speculating, {"logprobs": True}, "logprobs"),
        (speculating, {"prediction": {"type": "content", "content": ""}}, "empty"),
    ]
    for client, options, reason in refusals:
        with pytest.raises(openai.BadRequestError, match=reason) as raised:
            _answer(client, **{"prediction": predicted, **options})
        assert raised.value.body["param"] == "prediction"
