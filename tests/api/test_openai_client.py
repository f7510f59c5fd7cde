"""The OpenAI client against the tiny model: shapes, streaming, n, seeds, stop strings, logprobs, usage."""

import pytest

PROMPT = "The quick brown fox"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say something."},
]


def _stream_completion(client, **kwargs):
    chunks = list(client.completions.create(stream=True, **kwargs))
    texts: dict[int, str] = {}
    finish = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    return chunks, texts, finish


def test_models_lists_the_served_model(tiny_client):
    models = tiny_client.models.list().data
    assert [m.id for m in models] == ["tiny"] and models[0].owned_by == "spyglass"


def test_completion_shape_and_usage(tiny_client, tiny_llama_dir):
    from spyglass.core.tokenizer import Tokenizer

    response = tiny_client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    choice = response.choices[0]
    assert choice.finish_reason == "length" and choice.index == 0 and choice.text
    tokenizer = Tokenizer.from_hf_dir(tiny_llama_dir)
    assert response.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert response.usage.completion_tokens == 7
    assert response.usage.total_tokens == response.usage.prompt_tokens + 7
    assert response.usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_completion_equals_non_streamed(tiny_client):
    kwargs = dict(
        model="tiny",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0.8,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    full = tiny_client.completions.create(**kwargs)
    chunks, texts, finish = _stream_completion(
        tiny_client, stream_options={"include_usage": True}, **kwargs
    )
    assert texts[0] == full.choices[0].text
    assert finish == {0: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_continuous_usage_counts_the_tokens_streamed_so_far(tiny_client):
    """vLLM's ``continuous_usage_stats``: every chunk carries the usage up to it (each logprob is
    one token), and the last one's is the final usage."""
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=9, n=2, logprobs=0, temperature=1.0)
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks, _, _ = _stream_completion(
        tiny_client, stream_options=options, seed=5, extra_body={"ignore_eos": True}, **kwargs
    )
    *streamed, last = chunks
    sent = 0
    for chunk in streamed:
        sent += sum(len(c.logprobs.tokens) for c in chunk.choices)
        assert chunk.usage.completion_tokens == sent
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + sent
    assert sent == 18 and last.choices == [] and last.usage.completion_tokens == 18
    chat = list(
        tiny_client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options=options,
            extra_body={"ignore_eos": True},
        )
    )
    counts = [c.usage.completion_tokens for c in chat]
    assert all(c.usage is not None for c in chat) and counts == sorted(counts) and counts[-1] == 6
    with pytest.raises(Exception) as refused:
        _stream_completion(tiny_client, stream_options={"continuous_usage_stats": True}, **kwargs)
    assert refused.value.status_code == 400 and "include_usage" in str(refused.value)


def test_same_seed_same_text_and_n_choices(tiny_client):
    kwargs = dict(
        model="tiny",
        prompt=PROMPT,
        max_tokens=10,
        temperature=1.0,
        seed=123,
        n=3,
        extra_body={"ignore_eos": True},
    )
    first = tiny_client.completions.create(**kwargs)
    second = tiny_client.completions.create(**kwargs)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.text for c in second.choices]
    assert len(set(texts)) > 1, "choices with seeds seed+i should differ"
    assert (
        first.usage.completion_tokens == 30
        and first.usage.prompt_tokens == second.usage.prompt_tokens
    )
    _, streamed, finish = _stream_completion(tiny_client, **kwargs)
    assert [streamed[i] for i in range(3)] == texts and set(finish.values()) == {"length"}


def test_list_of_prompts_and_token_prompts(tiny_client):
    prompts = ["Hello", [1, 2, 3, 4]]
    response = tiny_client.completions.create(
        model="tiny",
        prompt=prompts,
        max_tokens=3,
        temperature=0,
        n=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert response.usage.completion_tokens == 12
    echoed = tiny_client.completions.create(
        model="tiny", prompt="Hello", max_tokens=2, temperature=0, echo=True
    )
    assert echoed.choices[0].text.startswith("Hello")


def test_stop_string_cuts_the_text(tiny_client):
    kwargs = dict(
        model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    text = tiny_client.completions.create(**kwargs).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    expected = text[: text.find(stop)]
    stopped = tiny_client.completions.create(stop=[stop], **kwargs).choices[0]
    assert stopped.text == expected and stopped.finish_reason == "stop"
    _, streamed, finish = _stream_completion(tiny_client, stop=stop, **kwargs)
    assert streamed[0] == expected and finish == {0: "stop"}


def test_completion_logprobs(tiny_client):
    response = tiny_client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    for _token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert value <= 0 and len(top) <= 3
        assert max(top.values()) == pytest.approx(value, abs=1e-4), (
            "greedy picks the most likely token"
        )
    assert "".join(logprobs.tokens) == response.choices[0].text


def test_chat_non_streamed_and_streamed(tiny_client):
    kwargs = dict(
        model="tiny",
        messages=MESSAGES,
        max_completion_tokens=9,
        temperature=0.7,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    full = tiny_client.chat.completions.create(**kwargs)
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    assert full.choices[0].message.role == "assistant" and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 9
    chunks = list(
        tiny_client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    assert (
        chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    )
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_chat_text_parts_n_and_logprobs(tiny_client):
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "something."}],
        }
    ]
    response = tiny_client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=4,
        n=2,
        seed=1,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert len(response.choices) == 2 and response.usage.completion_tokens == 8
    content = response.choices[0].logprobs.content
    assert len(content) == 4 and all(len(entry.top_logprobs) == 2 for entry in content)
    assert "".join(entry.token for entry in content) == response.choices[0].message.content
    chunks = list(
        tiny_client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=4,
            n=2,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert {c.choices[0].index for c in chunks} == {0, 1}


def test_cached_tokens_count_prefix_cache_hits(tiny_client):
    prompt = "A repeated prefix. " * 20
    first = tiny_client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    second = tiny_client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    # Every full block of the prompt is a hit the second time (block size 16).
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= (first.usage.prompt_tokens - 1) // 16 * 16 > 0
