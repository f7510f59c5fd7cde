"""Completions' ``suffix``: on a model whose vocabulary has fill-in-the-middle tokens the answer
is the completion of the model's own FIM prompt (the same tokens, the same greedy text, streamed
or not, one prompt or several); elsewhere, and beside ``echo``, a 400 naming the field. The
formats are read from the vocabulary: StarCoder's, Qwen's, DeepSeek's, and Codestral's suffix
first."""

import openai
import pytest
import tokenizers
from tokenizers.models import WordLevel

from spyglass.core.api.fill_in_middle import FimTokens, fim_tokens
from spyglass.core.tokenizer import Tokenizer

BEFORE = "def add(a, b):\n    return "
AFTER = "\n\nprint(add(1, 2))\n"
GREEDY = {"model": "tiny", "temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def fim_client(tiny_fim_dir, tmp_path_factory):
    from tests.api.conftest import TINY_ARGS, start_server

    server = start_server(str(tiny_fim_dir), tmp_path_factory.mktemp("fim"), *TINY_ARGS)
    yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    server.stop()


def test_a_suffix_completes_the_models_own_fim_prompt(fim_client, tiny_fim_dir):
    reference = tokenizers.Tokenizer.from_file(str(tiny_fim_dir / "tokenizer.json"))
    ids = lambda text: reference.encode(text, add_special_tokens=False).ids
    marker = reference.token_to_id
    expected = [
        marker("<fim_prefix>"),
        *ids(BEFORE),
        marker("<fim_suffix>"),
        *ids(AFTER),
        marker("<fim_middle>"),
    ]
    filled = fim_client.completions.create(prompt=BEFORE, suffix=AFTER, **GREEDY)
    by_hand = fim_client.completions.create(prompt=expected, **GREEDY)
    assert filled.usage.prompt_tokens == len(expected) == by_hand.usage.prompt_tokens
    assert filled.choices[0].text == by_hand.choices[0].text != ""
    stream = fim_client.completions.create(prompt=BEFORE, suffix=AFTER, stream=True, **GREEDY)
    assert (
        "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        == filled.choices[0].text
    )
    # Each prompt of a list before the same suffix; a token-id prompt as its text's ids.
    both = fim_client.completions.create(prompt=[BEFORE, ids(BEFORE)], suffix=AFTER, **GREEDY)
    assert [choice.text for choice in both.choices] == [filled.choices[0].text] * 2
    with pytest.raises(openai.BadRequestError) as error:
        fim_client.completions.create(prompt=BEFORE, echo=True, suffix=AFTER, **GREEDY)
    assert error.value.body["param"] == "echo"


def test_a_model_without_fim_tokens_refuses_a_suffix(tiny_client):
    with pytest.raises(openai.BadRequestError) as error:
        tiny_client.completions.create(prompt=BEFORE, suffix=AFTER, **GREEDY)
    assert (error.value.body["param"], error.value.body["code"]) == (
        "suffix",
        "unsupported_parameter",
    )
    assert "fill-in-the-middle" in error.value.body["message"]
    # An empty suffix asks for nothing to fill: a plain completion.
    assert tiny_client.completions.create(prompt=BEFORE, suffix="", **GREEDY).choices


@pytest.mark.parametrize(
    "names, suffix_first",
    [
        (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), False),
        (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), False),
        (("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), False),
        (("[PREFIX]", "[SUFFIX]"), True),
    ],
)
def test_each_vocabularys_format_is_read_and_ordered(names, suffix_first):
    vocab = {name: i for i, name in enumerate(("<unk>", "a", "b", *names))}
    tokenizer = Tokenizer(tokenizers.Tokenizer(WordLevel(vocab, "<unk>")), None, None, (), False)
    fim = fim_tokens(tokenizer)
    middle = vocab[names[2]] if len(names) == 3 else None
    assert fim == FimTokens(vocab[names[0]], vocab[names[1]], middle, suffix_first)
    before, after = [vocab["a"]], [vocab["b"]]
    if suffix_first:  # Codestral: [SUFFIX] after [PREFIX] before, the middle follows
        assert fim.prompt([], before, after) == [fim.suffix, *after, fim.prefix, *before]
    else:
        assert fim.prompt([7], before, after) == [
            7,
            fim.prefix,
            *before,
            fim.suffix,
            *after,
            middle,
        ]


def test_a_vocabulary_without_all_three_has_none():
    vocab = {"<unk>": 0, "<fim_prefix>": 1, "<fim_suffix>": 2}  # no middle token
    tokenizer = Tokenizer(tokenizers.Tokenizer(WordLevel(vocab, "<unk>")), None, None, (), False)
    assert fim_tokens(tokenizer) is None
