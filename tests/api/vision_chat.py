"""A vision model's chat over HTTP checked against the offline API's answer."""

import openai
import requests


def assert_chats_as_offline(server, chat: list[dict], text: str, prompt_tokens: int, **options):
    """The official OpenAI client's chat completion of ``chat`` on ``server`` (8 greedy tokens,
    and ``options``) answers ``text`` over ``prompt_tokens``, streamed and not, and /tokenize
    counts as many; the response that was not streamed."""
    client = openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )
    create = {"model": "tiny", "messages": chat, "max_tokens": 8, "temperature": 0, **options}
    response = client.chat.completions.create(**create)
    assert response.choices[0].message.content == text
    assert response.usage.prompt_tokens == prompt_tokens
    stream = client.chat.completions.create(**create, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    counted = requests.post(
        f"{server.base_url}/tokenize",
        json={"messages": chat, "add_generation_prompt": True},
        timeout=60,
    ).json()
    assert counted["count"] == prompt_tokens
    return response
