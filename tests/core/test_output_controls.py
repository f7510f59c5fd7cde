"""vLLM's output controls in the engine: min_tokens, allowed_token_ids, bad_words,
include_stop_str_in_output, skip_special_tokens and truncate_prompt_tokens, with and without
drafts and async scheduling."""

import itertools
from dataclasses import replace

import pytest

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.request_intake import bad_word_token_ids
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams

PROMPTS = ["Hello world", "def f(x):\n    return x", "The weather today is", "1 2 3 4 5"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(make_tiny_engine):
    return make_tiny_engine()


@pytest.fixture(scope="module")
def tokenizer(engine):
    return engine.tokenizer


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def greedy(engine, run_engine, prompts):
    """The greedy output ids of each prompt, ignoring EOS."""
    return [o.outputs[0].token_ids for o in run_engine(engine, prompts, GREEDY)]


def test_min_tokens_holds_off_eos_and_stop_tokens(engine, run_engine, prompts, tokenizer):
    eos = tokenizer.eos_token_ids[0]
    # The bias makes EOS (or the stop token) the greedy choice at every position.
    eager_eos = SamplingParams(temperature=0, max_tokens=24, logit_bias={eos: 100})
    [quick] = run_engine(engine, prompts[:1], eager_eos)
    assert quick.outputs[0].token_ids == [eos]
    for min_tokens in (1, 5):
        [held] = run_engine(engine, prompts[:1], replace(eager_eos, min_tokens=min_tokens))
        ids = held.outputs[0].token_ids
        assert len(ids) == min_tokens + 1 and ids[-1] == eos and eos not in ids[:-1]
        assert held.outputs[0].finish_reason == "stop"
    stop_token = tokenizer.encode(" the", add_special_tokens=False)[0]
    eager_stop = SamplingParams(
        temperature=0, max_tokens=24, stop_token_ids=[stop_token], logit_bias={stop_token: 100}
    )
    [held] = run_engine(engine, prompts[:1], replace(eager_stop, min_tokens=3))
    assert held.outputs[0].token_ids[3:] == [stop_token]
    assert held.outputs[0].stop_reason == stop_token


def test_min_tokens_holds_off_stop_strings(engine, run_engine, prompts, greedy, tokenizer):
    ids = greedy[0]
    early = tokenizer.decode(ids[:3])
    stop = early[-2:]
    full = tokenizer.decode(ids)
    [plain] = run_engine(engine, prompts[:1], replace(GREEDY, stop=[stop]))
    assert plain.outputs[0].text == full[: full.find(stop)]
    [held] = run_engine(engine, prompts[:1], replace(GREEDY, stop=[stop], min_tokens=3))
    later = full.find(stop, len(early))
    assert held.outputs[0].text == (full if later < 0 else full[:later])


def test_include_stop_str_in_output_keeps_the_stop_string(engine, run_engine, prompts, greedy):
    full = engine.tokenizer.decode(greedy[1])
    stop = full[5:8]
    params = replace(GREEDY, stop=[stop], include_stop_str_in_output=True)
    [output] = run_engine(engine, prompts[1:2], params)
    completion = output.outputs[0]
    assert completion.text == full[: full.find(stop) + len(stop)]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop


def test_streamed_text_with_the_stop_string_only_grows(engine, prompts, greedy):
    full = engine.tokenizer.decode(greedy[1])
    stop = full[5:8]
    engine.add_request(
        "grows", prompts[1], replace(GREEDY, stop=[stop], include_stop_str_in_output=True)
    )
    texts = []
    while engine.has_unfinished_requests:
        texts += [o.outputs[0].text for o in engine.step()]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert texts[-1].endswith(stop)


def test_allowed_token_ids_limit_every_token(engine, run_engine, prompts, greedy):
    allowed = sorted({t for ids in greedy for t in ids[:6]})[:5]
    sampled = SamplingParams(temperature=1.0, seed=7, max_tokens=20, ignore_eos=True)
    outputs = run_engine(engine, prompts, replace(sampled, allowed_token_ids=allowed))
    assert all(set(o.outputs[0].token_ids) <= set(allowed) for o in outputs)
    # Greedy over the allowed ids is greedy with them lifted above every other token.
    limited = run_engine(engine, prompts, replace(GREEDY, allowed_token_ids=allowed))
    lifted = run_engine(engine, prompts, replace(GREEDY, logit_bias=dict.fromkeys(allowed, 100)))
    assert [o.outputs[0].token_ids for o in limited] == [o.outputs[0].token_ids for o in lifted]


def _first_end(ids: list[int], words: tuple[tuple[int, ...], ...]) -> int | None:
    """The first position of ``ids`` that ends one of ``words``' token sequences."""
    ends = [
        i
        for word in words
        for i in range(len(word) - 1, len(ids))
        if tuple(ids[i - len(word) + 1 : i + 1]) == word
    ]
    return min(ends, default=None)


def _bad_words_of(tokenizer, ids: list[int]) -> list[str]:
    """A one-token and a two-token word taken from a greedy output."""
    return [tokenizer.decode(ids[2:3]).strip() or "x", tokenizer.decode(ids[6:8]).strip() or "y"]


@pytest.mark.parametrize("options", [{}, {"async_scheduling": True}], ids=["sync", "async"])
def test_bad_words_never_appear(make_tiny_engine, run_engine, prompts, greedy, tokenizer, options):
    engine = make_tiny_engine(**options)
    for prompt, ids in zip(prompts, greedy):
        words = _bad_words_of(tokenizer, ids)
        sequences = bad_word_token_ids(tokenizer, words)
        [output] = run_engine(engine, [prompt], replace(GREEDY, bad_words=words))
        banned_ids = output.outputs[0].token_ids
        assert _first_end(banned_ids, sequences) is None
        first = _first_end(ids, sequences)
        if first is not None:  # the same text up to where a bad word would end, then another token
            assert banned_ids[:first] == ids[:first] and banned_ids[first] != ids[first]


class AcceptedDrafts:
    """A plugin that counts the draft tokens verification accepted."""

    def __init__(self):
        self.num_accepted = 0

    @hookimpl
    def spyglass_drafts_verified(self, request, num_draft_tokens, num_accepted_tokens):
        """Add this step's accepted drafts."""
        self.num_accepted += num_accepted_tokens


def test_bad_words_and_min_tokens_hold_at_every_drafted_position(make_default_engine, run_engine):
    # The default model continues a counting loop, so n-gram drafts of it are accepted: a ban must
    # see the drafts before each verified position (" 3 4" is banned once " 3" is drafted).
    plain = make_default_engine()
    drafted = make_default_engine(
        plugins=["fcfs", "ngram"], speculative="ngram", num_speculative_tokens=3
    )
    accepted = AcceptedDrafts()
    drafted.plugin_manager.register(accepted)
    tokenizer = plain.tokenizer
    prompt = tokenizer.encode("1 2 3 4 1 2 3 4 1 2 3 4 1 2 3 4 1 2")
    four = tokenizer.encode("4", add_special_tokens=False)[0]
    banned = replace(GREEDY, bad_words=["3 4"])
    held = replace(GREEDY, ignore_eos=False, stop_token_ids=[four], min_tokens=9)
    outputs = []
    for params in (banned, held):
        [expected] = run_engine(plain, [prompt], params)
        accepted.num_accepted = 0
        [actual] = run_engine(drafted, [prompt], params)
        assert actual.outputs[0].token_ids == expected.outputs[0].token_ids
        assert accepted.num_accepted > 0
        outputs.append(actual.outputs[0])
    assert "3 4" not in outputs[0].text and "3" in outputs[0].text
    ids = outputs[1].token_ids
    assert four not in ids[:9]


def test_skip_special_tokens_false_keeps_their_text(engine, run_engine, prompts, tokenizer):
    special = next(t for t in tokenizer.all_special_ids if t not in tokenizer.eos_token_ids)
    forced = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logit_bias={special: 100})
    [skipped] = run_engine(engine, prompts[:1], forced)
    [kept] = run_engine(engine, prompts[:1], replace(forced, skip_special_tokens=False))
    assert skipped.outputs[0].token_ids == kept.outputs[0].token_ids == [special] * 3
    assert skipped.outputs[0].text == ""
    assert kept.outputs[0].text == tokenizer.decode([special] * 3, skip_special_tokens=False)


def test_the_stop_token_that_ends_the_output_adds_no_text_unless_asked(
    engine, run_engine, prompts, tokenizer
):
    # As vLLM: the EOS or stop token id that ends an output is in its token ids, not its text,
    # even where special tokens' text is kept; include_stop_str_in_output shows it.
    eos = tokenizer.eos_token_ids[0]
    comma = tokenizer.encode(",", add_special_tokens=False)[0]
    for stop_token, extra in ((eos, {}), (comma, {"stop_token_ids": [comma]})):
        forced = SamplingParams(
            temperature=0, max_tokens=4, allowed_token_ids=[stop_token], **extra
        )
        for skip in (True, False):
            [hidden] = run_engine(engine, prompts[:1], replace(forced, skip_special_tokens=skip))
            [shown] = run_engine(
                engine,
                prompts[:1],
                replace(forced, skip_special_tokens=skip, include_stop_str_in_output=True),
            )
            assert hidden.outputs[0].token_ids == shown.outputs[0].token_ids == [stop_token]
            assert hidden.outputs[0].text == ""
            assert shown.outputs[0].text == tokenizer.decode([stop_token], skip_special_tokens=skip)
    assert tokenizer.decode([eos], skip_special_tokens=False) and tokenizer.decode([comma])


def test_truncate_prompt_tokens_keeps_the_last_tokens(engine, run_engine, prompts, tokenizer):
    long_prompt = tokenizer.encode(" ".join(PROMPTS * 4))
    engine.add_request("cut", long_prompt, replace(GREEDY, truncate_prompt_tokens=10), prompt="x")
    outputs = []
    while engine.has_unfinished_requests:
        outputs += engine.step()
    [expected] = run_engine(engine, [long_prompt[-10:]], GREEDY)
    assert outputs[-1].prompt_token_ids == long_prompt[-10:]
    assert outputs[-1].prompt == tokenizer.decode(long_prompt[-10:], skip_special_tokens=False)
    assert outputs[-1].outputs[0].token_ids == expected.outputs[0].token_ids
    [whole] = run_engine(engine, [long_prompt], replace(GREEDY, truncate_prompt_tokens=-1))
    assert whole.prompt_token_ids == long_prompt


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=17, max_tokens=16), "min_tokens"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
        (dict(bad_words=[" "]), "bad_words"),
        (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    ],
)
def test_out_of_range_controls_name_their_field(params, param):
    with pytest.raises(InvalidRequestError) as error:
        SamplingParams(**params)
    assert error.value.param == param


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (dict(allowed_token_ids=[10**9]), "allowed_token_ids"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(min_tokens=2, allowed_token_ids=[2]), "min_tokens"),
    ],
)
def test_controls_the_vocabulary_rules_out_are_refused(engine, prompts, params, param):
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request("refused", prompts[0], SamplingParams(**params))
    assert error.value.param == param
    assert "refused" not in engine.requests
