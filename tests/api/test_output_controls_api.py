"""vLLM's request extras over HTTP with the official client (``extra_body``): min_tokens,
stop_token_ids, allowed_token_ids, bad_words, include_stop_str_in_output, skip_special_tokens,
truncate_prompt_tokens, and chat's add_generation_prompt, continue_final_message,
chat_template_kwargs and echo; on both server layouts."""

import itertools
import json
import re

import httpx
import openai
import pytest

from spyglass.core.tokenizer import Tokenizer

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
def server(layout_server):
    """The prompt a process server puts back on outputs must be the one its engine saw."""
    return layout_server


@pytest.fixture(scope="module")
def client(layout_client) -> openai.OpenAI:
    return layout_client


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir) -> Tokenizer:
    return Tokenizer.from_hf_dir(tiny_llama_dir)


def _complete(client, prompt=PROMPT, **extra):
    body = {**GREEDY, **extra}
    known = {
        k: body.pop(k)
        for k in ("temperature", "max_tokens", "logit_bias", "stop", "echo")
        if k in body
    }
    return client.completions.create(model="tiny", prompt=prompt, extra_body=body, **known)


def test_min_tokens_holds_off_eos(client, tokenizer):
    eos = tokenizer.eos_token_ids[0]
    forced = {"logit_bias": {str(eos): 100}}
    assert _complete(client, **forced).usage.completion_tokens == 1
    held = _complete(client, min_tokens=4, **forced)
    assert held.usage.completion_tokens == 5 and held.choices[0].finish_reason == "stop"


def test_stop_token_ids_end_the_answer_and_name_the_token(client, tokenizer):
    the = tokenizer.encode(" the", add_special_tokens=False)[0]
    response = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        logit_bias={str(the): 100},
        extra_body={**GREEDY, "stop_token_ids": [the], "min_tokens": 2},
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == the
    assert response.usage.completion_tokens == 3


def test_allowed_token_ids_and_bad_words(client, tokenizer):
    words = [" cat", " dog"]
    allowed = [tokenizer.encode(w, add_special_tokens=False)[0] for w in words]
    limited = _complete(client, allowed_token_ids=allowed, ignore_eos=True)
    assert re.fullmatch(r"( cat| dog)+", limited.choices[0].text)
    plain = _complete(client, ignore_eos=True).choices[0].text
    word = plain.split()[1]
    banned = _complete(client, bad_words=[word], ignore_eos=True).choices[0].text
    assert word in plain and word not in banned
    assert banned.startswith(plain[: plain.index(word)].rstrip())


def test_include_stop_str_in_output_streamed_and_not(client):
    text = _complete(client, ignore_eos=True).choices[0].text
    stop = text[4:7]
    full = _complete(client, stop=[stop], include_stop_str_in_output=True, ignore_eos=True)
    assert full.choices[0].text == text[: text.index(stop) + len(stop)]
    streamed = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        stream=True,
        stop=[stop],
        extra_body={**GREEDY, "include_stop_str_in_output": True, "ignore_eos": True},
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full.choices[0].text


def test_skip_special_tokens_false_shows_them(client, tokenizer):
    special = next(t for t in tokenizer.all_special_ids if t not in tokenizer.eos_token_ids)
    forced = {"logit_bias": {str(special): 100}, "ignore_eos": True, "max_tokens": 2}
    assert _complete(client, **forced).choices[0].text == ""
    shown = _complete(client, skip_special_tokens=False, **forced).choices[0].text
    assert shown == tokenizer.decode([special] * 2, skip_special_tokens=False)


def test_truncate_prompt_tokens_keeps_the_prompts_end(client, server, tokenizer):
    # Far over the context (and its byte bound): without truncation, a 400.
    long_prompt = "word " * 40_000
    too_long = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"prompt": long_prompt, "max_tokens": 2},
        timeout=60,
    )
    assert too_long.status_code == 400
    response = _complete(client, long_prompt, truncate_prompt_tokens=16, echo=True, max_tokens=2)
    kept = tokenizer.encode(long_prompt)[-16:]
    assert response.usage.prompt_tokens == 16
    echoed = tokenizer.decode(kept, skip_special_tokens=False)
    assert response.choices[0].text.startswith(echoed) and len(echoed) < 200


def _tokenize(server, **body) -> dict:
    response = httpx.post(f"{server.base_url}/tokenize", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_continue_final_message_with_echo(client, server, tokenizer):
    messages = [
        {"role": "user", "content": "Finish my sentence."},
        {"role": "assistant", "content": "The sea is"},
    ]
    template = {"add_generation_prompt": False, "continue_final_message": True}
    prompt = _tokenize(server, messages=messages, **template)
    assert tokenizer.decode(prompt["tokens"]).endswith("The sea is")
    fresh = _tokenize(server, messages=messages)
    assert fresh["count"] > prompt["count"]  # the end of the turn and a new assistant header
    body = {**GREEDY, **template, "echo": True, "ignore_eos": True}
    response = client.chat.completions.create(model="tiny", messages=messages, extra_body=body)
    assert response.usage.prompt_tokens == prompt["count"]
    content = response.choices[0].message.content
    assert content.startswith("The sea is") and len(content) > len("The sea is")
    stream = client.chat.completions.create(
        model="tiny", messages=messages, stream=True, extra_body=body
    )
    deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert deltas[1] == "The sea is" and "".join(deltas) == content


def test_add_generation_prompt_false_ends_after_the_last_turn(server, tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    without = _tokenize(server, messages=messages, add_generation_prompt=False)
    with_prompt = _tokenize(server, messages=messages)
    assert with_prompt["tokens"][: without["count"]] == without["tokens"]
    assert "assistant" in tokenizer.decode(with_prompt["tokens"][without["count"] :])


def test_chat_template_kwargs_reach_the_template_but_cannot_replace_its_variables(server):
    messages = [{"role": "user", "content": "hi"}]
    plain = _tokenize(server, messages=messages)
    extra = _tokenize(server, messages=messages, chat_template_kwargs={"enable_thinking": False})
    assert extra["tokens"] == plain["tokens"]  # the default template reads no such variable
    clash = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"messages": messages, "chat_template_kwargs": {"messages": []}},
        timeout=30,
    )
    assert clash.status_code == 400 and "messages" in clash.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
        ({"min_tokens": 20, "max_tokens": 4}, "min_tokens"),
        ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"bad_words": ["  "]}, "bad_words"),
        # Found by schemathesis: only EOS may end an empty choice, and it is not allowed.
        ({"allowed_token_ids": [0], "guided_choice": [""]}, "allowed_token_ids"),
    ],
)
def test_bad_extras_are_400s_naming_the_field(server, body, param):
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_echo_with_logprobs_scores_the_prompt_as_generation_scored_it(client, tokenizer):
    # What evaluation harnesses send to score a text: echo, logprobs, one token.
    generated = _complete(client, logprobs=1, ignore_eos=True, max_tokens=8)
    continuation = generated.choices[0]
    prompt_ids = tokenizer.encode(PROMPT)
    scored = client.completions.create(
        model="tiny",
        prompt=prompt_ids
        + [tokenizer.encode(t, add_special_tokens=False)[0] for t in continuation.logprobs.tokens],
        echo=True,
        logprobs=1,
        max_tokens=1,
        temperature=0,
    )
    logprobs = scored.choices[0].logprobs
    num_prompt = len(prompt_ids) + 8
    assert len(logprobs.tokens) == num_prompt + 1 and logprobs.token_logprobs[0] is None
    assert logprobs.top_logprobs[0] is None
    assert logprobs.tokens[len(prompt_ids) : num_prompt] == continuation.logprobs.tokens
    assert logprobs.token_logprobs[len(prompt_ids) : num_prompt] == pytest.approx(
        continuation.logprobs.token_logprobs, abs=1e-4
    )
    assert scored.choices[0].text.startswith(tokenizer.decode(prompt_ids))
    assert scored.usage.prompt_tokens == num_prompt
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_prompt_logprobs_in_vllms_shape(client, tokenizer):
    response = _complete(client, prompt_logprobs=2, max_tokens=1)
    scored = response.choices[0].model_extra["prompt_logprobs"]
    prompt_ids = tokenizer.encode(PROMPT)
    assert len(scored) == len(prompt_ids) and scored[0] is None
    for token_id, entry in zip(prompt_ids[1:], scored[1:]):
        mine = entry[str(token_id)]
        assert mine["decoded_token"] == tokenizer.decode([token_id], skip_special_tokens=False)
        others = {e["rank"] for key, e in entry.items() if key != str(token_id)}
        assert others <= {1, 2} and len(entry) == (2 if mine["rank"] <= 2 else 3)
        best = max(entry.values(), key=lambda e: e["logprob"])
        assert best["rank"] == 1 and all(e["logprob"] <= best["logprob"] for e in entry.values())


def test_chat_prompt_logprobs_score_the_rendered_prompt(client, tokenizer):
    # vLLM's: on the response, per token of the prompt the template rendered; the same scores
    # the completions API gives that text. Not streamed (a 400 naming the field).
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=1, extra_body={"prompt_logprobs": 1}
    )
    scored = chat.model_extra["prompt_logprobs"]
    rendered = tokenizer.apply_chat_template(messages)
    assert len(scored) == chat.usage.prompt_tokens == len(tokenizer.encode(rendered, False))
    completion = _complete(client, prompt=rendered, prompt_logprobs=1, max_tokens=1)
    assert scored == completion.choices[0].model_extra["prompt_logprobs"]
    streamed = httpx.post(
        f"{client.base_url}chat/completions",
        json={"messages": messages, "prompt_logprobs": 1, "stream": True},
        timeout=30,
    )
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"


def test_a_grammar_that_must_end_overrides_min_tokens(client):
    # Found by fuzzing: the regex allows only EOS after "0", which min_tokens holds off.
    response = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"guided_regex": "0", "min_tokens": 4, "max_tokens": 8},
    )
    assert response.choices[0].message.content == "0"
    assert response.choices[0].finish_reason == "stop"


def test_return_tokens_as_token_ids_names_tokens_by_id(client, tokenizer):
    named = _complete(client, logprobs=2, ignore_eos=True, max_tokens=4, echo=True)
    by_id = _complete(
        client,
        logprobs=2,
        ignore_eos=True,
        max_tokens=4,
        echo=True,
        return_tokens_as_token_ids=True,
    )
    ids = [int(token.removeprefix("token_id:")) for token in by_id.choices[0].logprobs.tokens]
    assert [tokenizer.decode([i], skip_special_tokens=False) for i in ids] == (
        named.choices[0].logprobs.tokens
    )
    assert by_id.choices[0].logprobs.text_offset == named.choices[0].logprobs.text_offset
    assert all(key.startswith("token_id:") for key in by_id.choices[0].logprobs.top_logprobs[1])
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        top_logprobs=1,
        extra_body={**GREEDY, "max_tokens": 3, "return_tokens_as_token_ids": True},
    )
    for entry in chat.choices[0].logprobs.content:
        token_id = int(entry.token.removeprefix("token_id:"))
        assert bytes(entry.bytes).decode(errors="replace") == tokenizer.decode(
            [token_id], skip_special_tokens=False
        )


def _chat(server, **body) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, **body},
        timeout=60,
    )


def test_vllms_structured_outputs_field(server):
    choice = _chat(server, structured_outputs={"choice": ["yes", "no"]}).json()
    assert choice["choices"][0]["message"]["content"] in ("yes", "no")
    schema = {"enum": ["alpha", "beta"]}  # short whatever the random model prefers
    for spec in (schema, json.dumps(schema)):  # a schema, or its JSON text
        answer = _chat(server, structured_outputs={"json": spec})
        assert json.loads(answer.json()["choices"][0]["message"]["content"]) in ("alpha", "beta")
    regex = _chat(server, structured_outputs={"regex": "[0-9]{3}"}).json()
    assert re.fullmatch("[0-9]{3}", regex["choices"][0]["message"]["content"])
    for body, param in (
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a"}, "guided_regex": "a"}, "structured_outputs"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs"),
    ):
        response = _chat(server, **body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    empty = _chat(server, structured_outputs={"structural_tag": "{}"})
    assert empty.status_code == 400 and "list of structures" in empty.json()["error"]["message"]
    unknown = _chat(server, structured_outputs={"whitespace_pattern": " "})
    assert unknown.status_code == 400 and "whitespace_pattern" in unknown.json()["error"]["message"]


def _stream(server, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed call."""
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=60) as response:
        lines = [line.removeprefix("data: ") for line in response.iter_lines()]
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_return_token_ids_gives_the_prompts_and_each_choices_ids(server, tokenizer):
    # vLLM's return_token_ids: the ids behind the text, so that a caller (an RL trainer) never
    # re-tokenizes it; a stream's pieces add up to the whole answer's, prompt ids sent once.
    completions = f"{server.base_url}/v1/completions"
    body = {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "n": 2, "seed": 1}
    plain = httpx.post(completions, json=body, timeout=60).json()
    assert not {"token_ids", "prompt_token_ids"} & set(plain["choices"][0])
    whole = httpx.post(completions, json={**body, "return_token_ids": True}, timeout=60).json()
    for choice, before in zip(whole["choices"], plain["choices"]):
        assert choice["prompt_token_ids"] == tokenizer.encode(PROMPT)
        assert len(choice["token_ids"]) == 6 and choice["text"] == before["text"]
        assert tokenizer.decode(choice["token_ids"]) == choice["text"]
    chunks = _stream(server, "/v1/completions", {**body, "return_token_ids": True, "stream": True})
    for index, choice in enumerate(whole["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert [*itertools.chain(*(c["token_ids"] for c in mine))] == choice["token_ids"]
        assert [c.get("prompt_token_ids") for c in mine[:2]] == [choice["prompt_token_ids"], None]

    messages = [{"role": "user", "content": "hi"}]
    weather = {"type": "function", "function": {"name": "weather", "parameters": {}}}
    # Plain content, and content parsed for tool calls as it streams.
    for extra in ({}, {"tools": [weather]}):
        chat = {"messages": messages, **GREEDY, "return_token_ids": True, **extra}
        answer = _chat(server, **chat).json()
        assert len(answer["prompt_token_ids"]) == answer["usage"]["prompt_tokens"]
        if not extra:
            rendered = tokenizer.apply_chat_template(messages)
            assert answer["prompt_token_ids"] == tokenizer.encode(rendered, False)
        (choice,) = answer["choices"]
        assert len(choice["token_ids"]) == answer["usage"]["completion_tokens"]
        assert tokenizer.decode(choice["token_ids"]) == choice["message"]["content"]
        chunks = _stream(server, "/v1/chat/completions", {**chat, "stream": True})
        assert chunks[0]["prompt_token_ids"] == answer["prompt_token_ids"]
        assert all("prompt_token_ids" not in c for c in chunks[1:])
        streamed = [c["choices"][0].get("token_ids", []) for c in chunks if c["choices"]]
        assert [*itertools.chain(*streamed)] == choice["token_ids"]

    beams = _chat(server, n=2, use_beam_search=True, max_tokens=4, return_token_ids=True).json()
    for choice in beams["choices"]:
        assert tokenizer.decode(choice["token_ids"]) == choice["message"]["content"]
    assert beams["prompt_token_ids"] == tokenizer.encode(
        tokenizer.apply_chat_template(messages), False
    )
