"""Tokenizers built from GGUF metadata against transformers' for the same file: the default model's
byte-level BPE, and a SentencePiece (``tokenizer.ggml.model == "llama"``) vocabulary written here."""

import gguf
import numpy as np
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
    assert (
        tokenizer.decode(ids)
        == hf_gguf_tokenizer.decode(ids, skip_special_tokens=True)
        == "user\nHi"
    )


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
def test_chat_template_matches_transformers(
    tokenizer, hf_gguf_tokenizer, messages, add_generation_prompt
):
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


def test_a_processor_chat_template_json_is_the_template(tiny_llama_dir, tmp_path):
    # As SmolVLM and llava-hf checkpoints ship theirs: the processor's template in a JSON file.
    import json
    import shutil

    model_dir = shutil.copytree(tiny_llama_dir, tmp_path / "with_processor_template")
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    (model_dir / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    loaded = Tokenizer.from_hf_dir(model_dir)
    assert loaded.chat_template == template
    assert loaded.apply_chat_template([{"role": "user", "content": "hi"}], False) == "<user>hi"


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
    evil = Tokenizer(
        tokenizer.backend, "{{ messages.__class__.__mro__ }}", 1, (2,), add_bos_token=False
    )
    with pytest.raises(Exception, match="unsafe|not safely"):
        evil.apply_chat_template([])


# A SentencePiece BPE vocabulary as Llama 2, Mistral and Phi-3 GGUF files hold one: <unk>, <s>, </s>,
# the 256 byte-fallback pieces, then the learned pieces scored by creation order (-rank).
_SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away, there lived a king.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "hello world, hello there; then them the other",
    "Q: What is the capital of France?\nA: Paris",
    "numbers 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144",
]
_BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _write_spm_gguf(
    path, pieces: list[str], scores: list[float], add_space_prefix: bool | None = None
):
    tokens = ["<unk>", "<s>", "</s>", *_BYTES, *pieces]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(8)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * (3 + 256) + [float(s) for s in scores])
    writer.add_token_types(
        [gguf.TokenType.UNKNOWN]
        + [gguf.TokenType.CONTROL] * 2
        + [gguf.TokenType.BYTE] * 256
        + [gguf.TokenType.NORMAL] * len(pieces)
    )
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _spm_tokenizer(path) -> Tokenizer:
    from spyglass.core.loaders.gguf_tokenizer import read_tokenizer

    return read_tokenizer(gguf.GGUFReader(path), (2,))


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    """A GGUF file with a 400-piece SentencePiece vocabulary trained on a small corpus."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    trained = BackendTokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train_from_iterator(
        _SPM_CORPUS * 10, trainers.BpeTrainer(vocab_size=400, show_progress=False)
    )
    pieces = [piece for piece, _ in sorted(trained.get_vocab().items(), key=lambda item: item[1])]
    return _write_spm_gguf(
        tmp_path_factory.mktemp("spm") / "spm.gguf", pieces, [-float(i) for i in range(len(pieces))]
    )


# transformers' Metaspace skips the prepended space when the text already starts with one (llama.cpp and
# SentencePiece do not), so texts with leading whitespace are only checked to round-trip.
SPM_TEXTS = [t for t in TEXTS if t and not t[0].isspace() and "<" not in t] + [
    "Once upon a time, in a land far away, there lived a king who loved numbers.",
]


@pytest.mark.parametrize("text", SPM_TEXTS)
def test_sentencepiece_gguf_ids_match_transformers(spm_gguf, text):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(spm_gguf.parent, gguf_file=spm_gguf.name)
    assert _spm_tokenizer(spm_gguf).encode(text) == theirs(text)["input_ids"]


@pytest.mark.parametrize(
    "text", [*TEXTS, "  two leading spaces", "\nnewline first", "ünïcödé bytes: ∑ 😀"]
)
def test_sentencepiece_gguf_round_trips(spm_gguf, text):
    tokenizer = _spm_tokenizer(spm_gguf)
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_token_id == 1
    assert tokenizer.decode(ids) == text


def test_sentencepiece_known_splits(tmp_path):
    # The pair whose merged piece scores higher merges first; characters without a piece fall back to bytes.
    pieces = ["\u2581", "a", "b", "c", "ab", "bc", "\u2581a"]
    ab_first = _spm_tokenizer(
        _write_spm_gguf(tmp_path / "ab.gguf", pieces, [-1, -2, -3, -4, -5, -9, -6])
    )
    bc_first = _spm_tokenizer(
        _write_spm_gguf(tmp_path / "bc.gguf", pieces, [-1, -2, -3, -4, -9, -5, -6])
    )

    def split(tokenizer, text):
        return [tokenizer.backend.id_to_token(i) for i in tokenizer.encode(text)[1:]]

    assert split(ab_first, "abc") == ["\u2581", "ab", "c"]
    assert split(bc_first, "abc") == ["\u2581a", "bc"]  # bc, then the \u2581 a pair
    assert split(bc_first, "a bc") == ["\u2581a", "\u2581", "bc"]
    assert split(ab_first, "cé") == ["\u2581", "c", "<0xC3>", "<0xA9>"]
    assert ab_first.decode(ab_first.encode("cé a")) == "cé a"
    # Gemma's vocabularies prepend no space.
    no_prefix = _spm_tokenizer(
        _write_spm_gguf(tmp_path / "gemma.gguf", pieces, [-1, -2, -3, -4, -5, -9, -6], False)
    )
    assert split(no_prefix, "abc a") == ["ab", "c", "\u2581a"]
    assert no_prefix.decode(no_prefix.encode("abc a")) == "abc a"
