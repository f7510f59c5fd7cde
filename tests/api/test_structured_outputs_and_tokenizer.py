"""Structured outputs and logit_bias through the official OpenAI client, against real servers."""

import json
import re
from enum import Enum

import openai
import pydantic
import pytest


class Kind(str, Enum):
    capital = "capital"
    town = "town"


class Landmark(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    year_built: int | None = pydantic.Field(default=None, ge=0, le=2100)


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    kind: Kind
    population: int = pydantic.Field(ge=0, le=50_000_000)
    landmarks: list[Landmark] = pydantic.Field(max_length=3)
    mayor: str | None = pydantic.Field(default=None, max_length=30)


MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Describe the city of Lyon in JSON."}]


def test_parse_returns_a_valid_instance_twenty_times_of_twenty(real_client):
    greedy = real_client.chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=City, temperature=0, max_tokens=300
    )
    sampled = real_client.chat.completions.parse(
        model=MODEL,
        messages=MESSAGES,
        response_format=City,
        temperature=0.8,
        seed=3,
        n=19,
        max_tokens=300,
    )
    choices = greedy.choices + sampled.choices
    assert len(choices) == 20
    for choice in choices:
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, City)
        City.model_validate_json(choice.message.content)


def test_json_object_always_parses(real_client):
    for question in (
        'Return {"name": "Bob", "age": 30} as JSON.',
        "A JSON object with the keys city and country for Paris.",
    ):
        choice = real_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            response_format={"type": "json_object"},
            temperature=0,
            max_tokens=400,
        ).choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(json.loads(choice.message.content), dict)


def test_regex_and_choice_always_match(tiny_client):
    # The tiny model's weights are random: only the constraint makes these outputs well-formed.
    regex = tiny_client.completions.create(
        model="tiny",
        prompt="Phone:",
        max_tokens=30,
        temperature=1.0,
        seed=2,
        n=8,
        extra_body={"guided_regex": r"\+33 [1-9]( [0-9]{2}){4}"},
    )
    for choice in regex.choices:
        assert re.fullmatch(r"\+33 [1-9]( [0-9]{2}){4}", choice.text), choice.text
    choice = tiny_client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Pick."}],
        max_tokens=10,
        temperature=1.0,
        seed=4,
        n=8,
        extra_body={"guided_choice": ["alpha", "beta", "gamma"]},
    )
    assert {c.message.content for c in choice.choices} <= {"alpha", "beta", "gamma"}


def test_streamed_constrained_output_equals_the_whole_one(tiny_client):
    options = dict(
        model="tiny",
        prompt="Code:",
        max_tokens=20,
        temperature=0,
        extra_body={"guided_regex": "[A-Z]{3}-[0-9]{3}"},
    )
    whole = tiny_client.completions.create(**options).choices[0].text
    streamed = "".join(
        chunk.choices[0].text
        for chunk in tiny_client.completions.create(stream=True, **options)
        if chunk.choices
    )
    assert streamed == whole and re.fullmatch("[A-Z]{3}-[0-9]{3}", whole)


def test_logit_bias_is_honoured(tiny_client):
    forced = tiny_client.completions.create(
        model="tiny",
        prompt="Hello",
        max_tokens=3,
        temperature=0,
        logit_bias={"42": 100},
        extra_body={"ignore_eos": True},
    )
    tokens = (
        tiny_client.completions.create(
            model="tiny",
            prompt="Hello",
            max_tokens=3,
            temperature=0,
            logit_bias={"42": 100},
            logprobs=1,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .logprobs.tokens
    )
    assert forced.choices[0].text == "".join(tokens) and len(set(tokens)) == 1


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format",
        ),
        ({"guided_regex": "(unclosed"}, "response_format"),
        # Beyond llguidance's limits, which show only when a token is consumed (the fuzzer's).
        ({"guided_regex": "a{99999999}"}, "response_format"),
        ({"guided_grammar": 'root ::= "a" root'}, "response_format"),
        (
            {"guided_grammar": "root ::= " + " | ".join(f'"w{i}"' for i in range(3000))},
            "response_format",
        ),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
    ],
)
def test_invalid_constraints_are_400s_naming_the_field(tiny_client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        tiny_client.completions.create(model="tiny", prompt="x", max_tokens=3, extra_body=extra)
    assert error.value.status_code == 400
    assert param in str(error.value.body), error.value.body


def test_tokenize_and_detokenize_round_trip(tiny_server, tiny_llama_dir):
    import httpx

    from spyglass.core.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_hf_dir(tiny_llama_dir)
    text = "Hello, tokenizer! <|im_start|>"
    body = httpx.post(f"{tiny_server.base_url}/tokenize", json={"prompt": text}).json()
    assert body["tokens"] == tokenizer.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] > 0
    back = httpx.post(f"{tiny_server.base_url}/detokenize", json={"tokens": body["tokens"]}).json()
    assert back["prompt"] == tokenizer.decode(body["tokens"], skip_special_tokens=False)
    chat = httpx.post(
        f"{tiny_server.base_url}/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}
    ).json()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat["tokens"] == tokenizer.encode(rendered)
    for path, payload in (
        ("/detokenize", {"tokens": [10**9]}),
        ("/tokenize", {}),
        ("/tokenize", {"prompt": 5}),
    ):
        response = httpx.post(f"{tiny_server.base_url}{path}", json=payload)
        assert response.status_code == 400, (path, payload, response.text)
