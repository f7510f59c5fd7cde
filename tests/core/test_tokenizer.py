"""The default model's tokenizer, built from GGUF metadata, against transformers' tokenizer for the same file."""

import pytest

from spyglass.core.tokenizer import Tokenizer

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " leading space",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\r\n",
    "multiple     spaces    between",
    "numbers 1234567890 and 3.14159, 2024-01-01",
    "Don't, can't, we'll, I'M, they're",
    "中文测试：你好，世界！",
    "日本語とカタカナ、한국어",
    "emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷",
    "Ünïcödé àccents façade naïve",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # comment\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|>",
    "<repo_name>spyglass<file_sep>main.py",
    "<|im_start|> not quite <|im_start",
]


@pytest.fixture(scope="module")
def tokenizer(default_checkpoint) -> Tokenizer:
    return default_checkpoint.tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers(tokenizer, hf_gguf_tokenizer, text):
    assert tokenizer.encode(text) == hf_gguf_tokenizer(text)["input_ids"]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text


def test_decode_skips_special_tokens_like_transformers(tokenizer, hf_gguf_tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>")
    assert tokenizer.decode(ids) == hf_gguf_tokenizer.decode(ids, skip_special_tokens=True) == "user\nHi"


def test_special_tokens(tokenizer, hf_gguf_tokenizer):
    assert tokenizer.vocab_size == len(hf_gguf_tokenizer) == 49152
    assert tokenizer.bos_token_id == hf_gguf_tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_ids == (hf_gguf_tokenizer.eos_token_id,) == (2,)
    assert set(tokenizer.all_special_ids) == set(hf_gguf_tokenizer.all_special_ids) | set(range(17))
    # SmolLM2 does not prepend BOS; its chat template writes <|im_start|> itself.
    assert tokenizer.encode("hi")[0] != tokenizer.bos_token_id


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, in 中文 please 🙂"},
    ],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_transformers(tokenizer, hf_gguf_tokenizer, messages, add_generation_prompt):
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_gguf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == theirs


def test_hf_dir_tokenizer_matches_gguf_tokenizer(tokenizer, tiny_llama_dir):
    from_dir = Tokenizer.from_hf_dir(tiny_llama_dir)
    for text in TEXTS:
        assert from_dir.encode(text) == tokenizer.encode(text)
    assert from_dir.chat_template == tokenizer.chat_template
    assert (from_dir.bos_token_id, from_dir.eos_token_ids) == (1, (2,))


def test_template_features_hf_templates_use(tokenizer):
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "{{ m | tojson }}{{ eos_token }}{% endfor %}"
    )
    custom = Tokenizer(tokenizer.backend, template, 1, (2,), add_bos_token=True)
    assert custom.apply_chat_template([{"role": "user", "content": "é<"}]) == (
        '<|im_start|>{"role": "user", "content": "é<"}<|im_end|>'
    )
    assert custom.encode("hi")[0] == 1
    with pytest.raises(Exception, match="no tools"):
        custom.apply_chat_template([{"role": "tool", "content": ""}])


def test_missing_chat_template_is_a_clear_error(tokenizer):
    bare = Tokenizer(tokenizer.backend, None, 1, (2,), add_bos_token=False)
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_cannot_escape_sandbox(tokenizer):
    evil = Tokenizer(tokenizer.backend, "{{ messages.__class__.__mro__ }}", 1, (2,), add_bos_token=False)
    with pytest.raises(Exception, match="unsafe|not safely"):
        evil.apply_chat_template([])
