"""``spyglass serve --stream-interval N``: a streamed answer comes at its first token, then every N
tokens, with the same text, logprobs and usage as streaming every token, whether the engine runs in
a thread or in its own process. (A listener that falls behind gets outputs merged, so a chunk may
hold more: the chunks' ends are checked to be among the outputs' ends.)"""

import openai
import pytest

from tests.api.conftest import LAYOUTS, TINY_ARGS

INTERVAL = 4
CHAT = dict(
    model="tiny",
    messages=[{"role": "user", "content": "Tell me a story."}],
    max_tokens=13,
    temperature=0.7,
    seed=11,
    logprobs=True,
    top_logprobs=2,
    stream_options={"include_usage": True},
    extra_body={"ignore_eos": True},
)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def _streamed_tokens(client) -> tuple[list[list[str]], str, int]:
    """Each content chunk's tokens (from its logprobs), the text and the usage's completion tokens."""
    chunks = list(client.chat.completions.create(stream=True, **CHAT))
    tokens = [
        [entry.token for entry in c.choices[0].logprobs.content]
        for c in chunks
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return tokens, text, chunks[-1].usage.completion_tokens


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunks_of_the_interval_carry_what_every_token_would(
    tiny_llama_dir, tiny_client, server_factory, layout
):
    every, text, usage = _streamed_tokens(tiny_client)
    assert usage == 13 and len(every) > 4
    engine = ["--engine-process"] if layout == "process" else []
    server = server_factory(
        str(tiny_llama_dir), *TINY_ARGS, "--stream-interval", str(INTERVAL), *engine
    )
    held, held_text, held_usage = _streamed_tokens(_client(server))
    ends = [sum(len(chunk) for chunk in held[: i + 1]) for i in range(len(held))]
    assert set(ends) <= {1, 5, 9, 13} and ends[-1] == 13
    assert [t for chunk in held for t in chunk] == [t for chunk in every for t in chunk]
    assert (held_text, held_usage) == (text, usage)
    assert f"stream interval {INTERVAL}," in server.log()  # the engine's start line says so
