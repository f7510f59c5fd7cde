"""IncrementalDetokenizer with the real SmolLM2 tokenizer: no broken characters while streaming,
stop strings held back."""

import random

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models

from spyglass.core.engine import detokenizer as detokenizer_module
from spyglass.core.engine.detokenizer import IncrementalDetokenizer
from spyglass.core.tokenizer import Tokenizer

TEXTS = [
    "中文测试：你好，世界！今天天气很好，我们去公园散步吧。",
    "emoji 😀🎉 family 👩‍👩‍👧 flags 🇫🇷🇯🇵 and 🧑🏽‍💻 at work",
    "日本語とカタカナ、한국어도 있어요 — Ünïcödé façade naïve",
    "混合 mixed 文本 with 🚀 rockets, 数字 12345 and code `print('你好')`",
]
PROMPTS = ["", "Translate:", "上一句是中文"]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_checkpoint):
    # The tiny model directory carries the default model's tokenizer (test_tokenizer checks they agree).
    return tiny_llama_checkpoint.tokenizer


def stream(tokenizer, prompt: str, token_ids: list[int], stop: list[str]):
    """Feed tokens one at a time; yields (detokenizer, visible text) after each."""
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt), stop)
    for token_id in token_ids:
        detokenizer.add_token(token_id)
        yield detokenizer, detokenizer.visible_text(False)
        if detokenizer.matched_stop is not None:
            return


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("text", TEXTS)
def test_streaming_never_shows_a_broken_character(tokenizer, prompt, text):
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    # The test means something only if some tokens end inside a character.
    assert any("\ufffd" in tokenizer.decode([t]) for t in token_ids)
    shown = ""
    for detokenizer, visible in stream(tokenizer, prompt, token_ids, stop=[]):
        assert "\ufffd" not in visible
        assert visible.startswith(shown)
        shown = visible
    assert detokenizer.text == detokenizer.visible_text(True) == tokenizer.decode(token_ids) == text


def test_special_tokens_are_skipped_in_the_stream(tokenizer):
    token_ids = tokenizer.encode(
        "<|im_start|>assistant\n你好<|im_end|> more", add_special_tokens=False
    )
    *_, (detokenizer, _) = stream(tokenizer, "", token_ids, stop=[])
    assert detokenizer.text == tokenizer.decode(token_ids) == "assistant\n你好 more"


def stop_cases(text: str, lengths=(1, 2, 3, 5)):
    """Every substring of the given lengths, as (stop string, text before its first occurrence)."""
    cases = {}
    for length in lengths:
        for start in range(len(text) - length + 1):
            stop = text[start : start + length]
            cases.setdefault(stop, text[: text.index(stop)])
    return cases


@pytest.mark.parametrize(
    "text", TEXTS[:3] + ["The quick brown fox jumps over the lazy dog; the end."]
)
def test_stop_strings_are_held_back_and_cut(tokenizer, text):
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    for stop, before in stop_cases(text).items():
        for detokenizer, visible in stream(
            tokenizer, "Say:", token_ids, stop=["never there", stop]
        ):
            # Nothing beyond the stop string's start is ever shown, not even a prefix of it.
            assert before.startswith(visible), (stop, visible)
        assert detokenizer.matched_stop == stop
        assert detokenizer.text == detokenizer.visible_text(True) == before


def test_held_back_prefix_is_released_at_the_end(tokenizer):
    token_ids = tokenizer.encode("hello wor", add_special_tokens=False)
    *_, (detokenizer, visible) = stream(tokenizer, "", token_ids, stop=["world"])
    assert detokenizer.matched_stop is None
    assert visible == "hello"  # four characters held back: "world" is five long
    assert detokenizer.visible_text(True) == "hello wor"


def test_earliest_of_several_stop_strings_wins(tokenizer):
    token_ids = tokenizer.encode("one two three four", add_special_tokens=False)
    *_, (detokenizer, _) = stream(tokenizer, "", token_ids, stop=["four", "two", "three"])
    assert detokenizer.matched_stop == "two"
    assert detokenizer.text == "one "


def test_stop_longer_than_the_text_so_far_hides_everything(tokenizer):
    # Regression: the holdback was sliced as text[:len(text) - holdback], which goes negative while the
    # text is still shorter than the holdback and then showed all but the last few characters.
    token_ids = tokenizer.encode("hi there", add_special_tokens=False)
    for detokenizer, visible in stream(
        tokenizer, "", token_ids, stop=["a much longer stop string"]
    ):
        assert visible == ""
    assert detokenizer.visible_text(True) == "hi there"


def test_a_prompt_ending_inside_a_character_leaks_none_of_its_text(tokenizer):
    # "😀" takes several tokens: a prompt cut inside it leaves the output starting with bytes
    # that complete nothing, shown as U+FFFD as a decode of the output alone shows them.
    token_ids = tokenizer.encode("Look 😀𝄞 done", add_special_tokens=False)
    cuts = [
        c for c in range(1, len(token_ids)) if tokenizer.decode(token_ids[:c]).endswith("\ufffd")
    ]
    assert cuts
    for cut in cuts:
        detokenizer = IncrementalDetokenizer(tokenizer, token_ids[:cut], [])
        for token_id in token_ids[cut:]:
            detokenizer.add_token(token_id)
        assert detokenizer.text == tokenizer.decode(token_ids[cut:])
        assert "Look" not in detokenizer.text


def _stray_byte(tokenizer) -> int:
    """A token that is one UTF-8 continuation byte: it completes no character, alone or repeated."""
    return next(
        t
        for t in range(tokenizer.vocab_size)
        if tokenizer.decode([t]) == "\ufffd" and tokenizer.decode([t, t, t]) == "\ufffd" * 3
    )


@pytest.mark.parametrize("after", ["", " and then some text", " €, 😀 and 你好"])
def test_a_long_run_of_stray_bytes_is_released_as_it_grows(tokenizer, after):
    # A model repeating a stray byte, or a client's logit_bias forcing one: the stream must not hold
    # the whole run back (each step would decode all of it again), yet the text stays exact.
    token_ids = [_stray_byte(tokenizer)] * 300 + tokenizer.encode(after, add_special_tokens=False)
    shown = ""
    for detokenizer, visible in stream(tokenizer, "Say:", token_ids, stop=[]):
        assert len(detokenizer.held) < detokenizer_module._MAX_HELD_TOKENS
        assert visible.startswith(shown)
        shown = visible
    # Exact, but for the U+FFFD of the last few held bytes (left out as an unfinished character).
    assert detokenizer.visible_text(True).rstrip("\ufffd") == tokenizer.decode(token_ids).rstrip(
        "\ufffd"
    )
    assert detokenizer.visible_text(True).startswith(shown)
    assert shown.count("\ufffd") >= 290  # shown while the run went on, not at its end


def test_characters_between_stray_bytes_come_out_whole(tokenizer):
    # "😀" and "你" take several tokens; runs of stray bytes before and after each, long enough to
    # be released mid-run, must not break them.
    stray = _stray_byte(tokenizer)
    words = tokenizer.encode("€ 😀 你好 done", add_special_tokens=False)
    token_ids = ([stray] * 9 + words + [stray] * 7) * 4
    *_, (detokenizer, visible) = stream(tokenizer, "", token_ids, stop=[])
    final = detokenizer.visible_text(True)
    assert final.rstrip("\ufffd") == tokenizer.decode(token_ids).rstrip("\ufffd")
    assert visible.count("😀") == 4 and visible.count("你好") == 4


def test_an_unfinished_character_at_the_end_is_left_out(tokenizer):
    # As vLLM does: bytes held at the end that complete no character do not end the final text.
    stray = _stray_byte(tokenizer)
    euro = tokenizer.encode("€", add_special_tokens=False)
    token_ids = tokenizer.encode("ok", add_special_tokens=False) + euro + [stray] * 3
    *_, (detokenizer, visible) = stream(tokenizer, "", token_ids, stop=["zz"])
    assert (
        detokenizer.held and "\ufffd" not in visible
    )  # the held bytes are not shown while streaming
    assert detokenizer.visible_text(True) == "ok€"


@pytest.mark.parametrize("stray_share", [0.3, 0.7, 0.95])
def test_random_tokens_among_stray_bytes_decode_exactly(tokenizer, stray_share):
    strays = [t for t in range(tokenizer.vocab_size) if tokenizer.decode([t]) == "\ufffd"]
    generator = random.Random(stray_share)
    for _ in range(40):
        token_ids = [
            generator.choice(strays)
            if generator.random() < stray_share
            else generator.randrange(tokenizer.vocab_size)
            for _ in range(200)
        ]
        *_, (detokenizer, _) = stream(tokenizer, "Hi", token_ids, stop=[])
        final = detokenizer.visible_text(True)
        assert final.rstrip("\ufffd") == tokenizer.decode(token_ids).rstrip("\ufffd")


def _byte_fallback_tokenizer() -> Tokenizer:
    """A SentencePiece-style vocabulary (Llama 2, Mistral, Gemma): 256 byte tokens besides pieces,
    decoded by ``ByteFallback``, which turns a run of byte tokens that is not valid UTF-8 into
    U+FFFD, one per token, letters included."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    vocab |= {"\u2581a": 259, "+": 260}
    backend = BackendTokenizer(
        models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>")
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return Tokenizer(backend, None, 1, (2,), True)


def test_a_byte_token_that_turns_shown_text_invalid_is_survived():
    # "g" as a byte token shows as "g"; one more byte (0xE2) that starts a character and "+" that
    # does not finish it make the decode of the three "\ufffd\ufffd+": the stream's text no longer
    # starts with what it showed, which raised out of the tokenizers library and failed the step.
    tokenizer = _byte_fallback_tokenizer()
    letter_a, g, e2, plus = 259, 3 + ord("g"), 3 + 0xE2, 260
    assert tokenizer.decode([g]) == "g" and tokenizer.decode([g, e2, plus]) == "\ufffd\ufffd+"
    detokenizer = IncrementalDetokenizer(tokenizer, [letter_a], [])
    for token_id in [letter_a, g, e2, plus, letter_a]:
        detokenizer.add_token(token_id)
    # What was shown stays; the rest is decoded on its own and the stream goes on after it.
    assert detokenizer.visible_text(True) == " ag\ufffd+ a"
    assert detokenizer.num_restarts == 1  # logged when the request finishes


@pytest.mark.parametrize(
    "stop, include_stop, min_tokens",
    [([], False, 0), (["e ", "an"], False, 0), (["e ", "an"], True, 0), (["the"], False, 40)],
)
def test_a_delta_read_at_every_token_adds_up_to_the_text(tokenizer, stop, include_stop, min_tokens):
    # What a delta output reads (`visible_since` from where the last one ended), at every token,
    # against slices of `visible_text`: the same text, and together the final one.
    strays = [t for t in range(tokenizer.vocab_size) if tokenizer.decode([t]) == "\ufffd"]
    generator = random.Random(len(stop) + min_tokens)
    words = tokenizer.encode(
        " ".join(TEXTS) + " then the answer and an end ", add_special_tokens=False
    )
    num_matched = 0
    for _ in range(20):
        token_ids = [
            generator.choice(strays) if generator.random() < 0.1 else generator.choice(words)
            for _ in range(300)
        ]
        detokenizer = IncrementalDetokenizer(
            tokenizer, [], stop, min_tokens=min_tokens, include_stop=include_stop
        )
        sent, deltas = 0, []
        for index, token_id in enumerate(token_ids):
            detokenizer.add_token(token_id)
            finished = detokenizer.matched_stop is not None or index == len(token_ids) - 1
            delta, length = detokenizer.visible_since(sent, finished)
            whole = detokenizer.visible_text(finished)
            assert (delta, length) == (whole[sent:], len(whole))
            sent = length
            deltas.append(delta)
            if finished:
                break
        assert "".join(deltas) == whole
        if not min_tokens:  # and against a decode of the tokens cut at the first stop string
            expected = tokenizer.decode(token_ids[: index + 1])
            hits = [(at, s) for s in stop if (at := expected.find(s)) >= 0]
            if hits:
                at, first = min(hits)
                expected = expected[: at + len(first) * include_stop]
            assert whole.rstrip("\ufffd") == expected.rstrip("\ufffd")
        if detokenizer.matched_stop is not None:
            num_matched += 1
            assert not include_stop or whole.endswith(detokenizer.matched_stop)
    assert (num_matched > 0) == bool(stop)  # the stop strings were met, and cut the text


class CountingDetokenizer(IncrementalDetokenizer):
    """Counts the stream's steps (one per token it decodes on its own)."""

    num_steps = 0

    def _step(self, token_id):
        self.num_steps += 1
        return super()._step(token_id)


def _read_in_runs(tokenizer, prompt_ids, token_ids, runs, generator, **options) -> list[str]:
    """Each run of tokens fed with `add_tokens` (lengths from ``runs``), and the visible text read
    after each; the final text last."""
    detokenizer = CountingDetokenizer(tokenizer, prompt_ids, [], **options)
    reads, at = [], 0
    while at < len(token_ids):
        length = generator.choice(runs)
        detokenizer.add_tokens(token_ids[at : at + length])
        at += length
        reads.append(detokenizer.visible_text(False))
    return reads + [detokenizer.visible_text(True), detokenizer.num_steps]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_a_run_of_tokens_read_at_once_reads_as_streamed(tokenizer, prompt, skip_special_tokens):
    # A final-only output reads all its tokens at once, a stream interval's several: one decode of
    # the run, where it is clean, must give the text that a stream's step per token gives.
    strays = [t for t in range(tokenizer.vocab_size) if tokenizer.decode([t]) == "\ufffd"]
    specials = tokenizer.encode("<|im_start|>assistant\n<|im_end|>", add_special_tokens=False)
    # Whole texts (characters of several tokens among them), special tokens, and stray bytes.
    pieces = [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS]
    pieces += [[token] for token in specials]
    generator = random.Random(prompt + str(skip_special_tokens))
    prompt_ids = tokenizer.encode(prompt)
    num_decoded_at_once = 0
    for stray_share in (0.0, 0.1, 0.5):
        for _ in range(10):
            token_ids = []
            while len(token_ids) < 120:
                stray = generator.random() < stray_share
                token_ids += [generator.choice(strays)] if stray else generator.choice(pieces)
            options = {"skip_special_tokens": skip_special_tokens}
            streamed = _read_in_runs(tokenizer, prompt_ids, token_ids, [1], generator, **options)
            for runs in ([len(token_ids)], [2, 3, 17], [1, 5]):
                *texts, num_steps = _read_in_runs(
                    tokenizer, prompt_ids, token_ids, runs, generator, **options
                )
                assert texts[-1] == streamed[-2]
                assert all(streamed[-2].startswith(text) for text in texts)
                num_decoded_at_once += num_steps < len(token_ids)
    assert num_decoded_at_once > 30  # the one-call decode was taken, not only the fallback


def test_a_run_with_a_stray_byte_falls_back_to_the_stream(tokenizer):
    stray = _stray_byte(tokenizer)
    token_ids = tokenizer.encode("ok then", add_special_tokens=False) + [stray]
    token_ids += tokenizer.encode(" more 你好", add_special_tokens=False)
    detokenizer = CountingDetokenizer(tokenizer, tokenizer.encode("Say:"), [])
    detokenizer.add_tokens(token_ids)
    assert detokenizer.num_steps == len(token_ids)
    assert detokenizer.visible_text(True) == tokenizer.decode(token_ids)


def test_a_byte_token_run_read_at_once_is_survived_as_streamed():
    # The run that made the stream restart (`test_a_byte_token_that_turns_shown_text_invalid_is_
    # survived`) decodes to U+FFFD as a whole: it goes token by token, to the same text.
    tokenizer = _byte_fallback_tokenizer()
    letter_a, g, e2, plus = 259, 3 + ord("g"), 3 + 0xE2, 260
    detokenizer = IncrementalDetokenizer(tokenizer, [letter_a], [])
    detokenizer.add_tokens([letter_a, g, e2, plus, letter_a])
    assert detokenizer.visible_text(True) == " ag\ufffd+ a"
    assert detokenizer.num_restarts == 1
