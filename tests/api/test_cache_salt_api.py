"""vLLM's ``cache_salt`` over HTTP: a salted request's prompt is cached for its salt alone."""

import openai
import pytest

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 6


def _cached(client: openai.OpenAI, salt: str | None) -> int:
    extra = {} if salt is None else {"cache_salt": salt}
    response = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        max_tokens=2,
        extra_body=extra,
    )
    return response.usage.prompt_tokens_details.cached_tokens


def test_a_salt_sees_only_its_own_cached_prompts(tiny_client):
    assert _cached(tiny_client, "salt-one") == 0
    assert _cached(tiny_client, "salt-one") > 0
    assert _cached(tiny_client, "salt-two") == 0


def test_an_empty_salt_is_refused(tiny_client):
    with pytest.raises(openai.BadRequestError) as error:
        _cached(tiny_client, "")
    assert error.value.body["param"] == "cache_salt"
