"""The offline API as a user sees it: ``from spyglass import LLM, SamplingParams`` on the tiny Llama."""

import dataclasses

import pytest

from spyglass import LLM, CompletionOutput, RequestOutput, SamplingParams
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.engine.snapshot import EngineSnapshot

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir) -> LLM:
    # Every installed plugin, as a user gets them; a small KV budget and context to test the limits.
    return LLM(
        model=str(tiny_llama_dir), dtype="float32", kv_cache_memory="8MiB", max_model_len=128
    )


@pytest.fixture(autouse=True)
def engine_left_idle(llm):
    yield
    assert not llm.engine.has_unfinished_requests
    pool = llm.engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks


def texts(outputs):
    return [o.outputs[0].text for o in outputs]


def test_request_output_fields(llm):
    [output] = llm.generate("Hello, my name is", GREEDY, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    assert isinstance(output, RequestOutput) and output.finished
    assert isinstance(output.request_id, str)
    assert output.prompt == "Hello, my name is"
    assert output.prompt_token_ids == tokenizer.encode("Hello, my name is")
    assert output.num_cached_tokens == 0
    [completion] = output.outputs
    assert isinstance(completion, CompletionOutput)
    assert completion.index == 0
    assert len(completion.token_ids) == 8
    # A last token that ends inside a character is left out of the text, as in vLLM.
    assert completion.text == tokenizer.decode(completion.token_ids).rstrip("\ufffd")
    assert (completion.finish_reason, completion.stop_reason, completion.logprobs) == (
        "length",
        None,
        None,
    )


def test_outputs_come_back_in_input_order(llm):
    prompts = ["one", "two two", "three three three", "four four four four", "five"]
    # Later prompts ask for fewer tokens, so they finish first.
    params = [
        SamplingParams(temperature=0, max_tokens=10 - 2 * i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt for o in outputs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outputs] == [10, 8, 6, 4, 2]
    # Each equals the prompt run alone.
    for prompt, p, output in zip(prompts, params, outputs):
        assert texts(llm.generate(prompt, p, use_tqdm=False)) == texts([output])


def test_prompt_token_ids(llm):
    token_ids = llm.get_tokenizer().encode("The sky is")
    from_text, from_ids, with_text = llm.generate(
        [
            "The sky is",
            {"prompt_token_ids": token_ids},
            {"prompt": "The sky is", "prompt_token_ids": token_ids},
        ],
        GREEDY,
        use_tqdm=False,
    )
    assert from_ids.prompt is None and with_text.prompt == "The sky is"
    assert from_ids.prompt_token_ids == token_ids
    assert (
        from_text.outputs[0].token_ids
        == from_ids.outputs[0].token_ids
        == with_text.outputs[0].token_ids
    )


def test_one_sampling_params_per_prompt(llm):
    short, long = llm.generate(
        ["a", "b"],
        [
            SamplingParams(max_tokens=2, ignore_eos=True),
            SamplingParams(max_tokens=5, ignore_eos=True),
        ],
        use_tqdm=False,
    )
    assert (len(short.outputs[0].token_ids), len(long.outputs[0].token_ids)) == (2, 5)
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)


def test_n_completions(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    [output] = llm.generate("Tell me a story", params, use_tqdm=False)
    assert [c.index for c in output.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in output.outputs}) == 3
    assert output.prompt == "Tell me a story" and output.finished
    [again] = llm.generate("Tell me a story", params, use_tqdm=False)
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in output.outputs]
    # A plain request with the n-th derived seed is the n-th completion.
    single = SamplingParams(temperature=1.0, seed=6, max_tokens=6, ignore_eos=True)
    assert (
        llm.generate("Tell me a story", single, use_tqdm=False)[0].outputs[0].token_ids
        == output.outputs[1].token_ids
    )
    [greedy] = llm.generate(
        "Tell me a story", SamplingParams(n=2, temperature=0, max_tokens=6), use_tqdm=False
    )
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids


def test_chat(llm):
    tokenizer = llm.get_tokenizer()
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    other = [{"role": "user", "content": "你好"}]
    [single] = llm.chat(conversation, GREEDY, use_tqdm=False)
    prompt = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    assert single.prompt == prompt and prompt.endswith("<|im_start|>assistant\n")
    assert texts([single]) == texts(llm.generate(prompt, GREEDY, use_tqdm=False))
    both = llm.chat([conversation, other], GREEDY, use_tqdm=False)
    assert len(both) == 2 and texts(both[:1]) == texts([single])
    assert both[1].prompt == tokenizer.apply_chat_template(other, add_generation_prompt=True)


def test_chat_continues_the_final_message(llm):
    conversation = [
        {"role": "user", "content": "Finish my sentence."},
        {"role": "assistant", "content": "The sea is "},
    ]
    [output] = llm.chat(
        conversation,
        GREEDY,
        use_tqdm=False,
        add_generation_prompt=False,
        continue_final_message=True,
        chat_template_kwargs={"enable_thinking": False},
    )
    # Cut right after the content as written (its trailing space too), no end of turn after it.
    assert output.prompt.endswith("<|im_start|>assistant\nThe sea is ")
    with pytest.raises(ValueError, match="add_generation_prompt"):
        llm.chat(conversation, GREEDY, use_tqdm=False, continue_final_message=True)


def test_prompt_logprobs_once_per_prompt_whatever_n(llm):
    scored = dataclasses.replace(GREEDY, prompt_logprobs=2, max_tokens=2)
    [one] = llm.generate("Hello, my name is", scored, use_tqdm=False)
    [two] = llm.generate("Hello, my name is", dataclasses.replace(scored, n=2), use_tqdm=False)
    assert len(two.outputs) == 2 and one.prompt_logprobs[0] is None
    assert len(one.prompt_logprobs) == len(one.prompt_token_ids)
    assert [lp and (lp.token_id, lp.rank) for lp in two.prompt_logprobs] == [
        lp and (lp.token_id, lp.rank) for lp in one.prompt_logprobs
    ]


def test_tokenizer_round_trip(llm):
    tokenizer = llm.get_tokenizer()
    text = "Spyglass 🔭 sees far: 你好!"
    token_ids = tokenizer.encode(text)
    assert all(isinstance(t, int) for t in token_ids)
    assert tokenizer.decode(token_ids) == text


@pytest.mark.parametrize(
    "options, param",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"n": 0}, "n"),
        ({"stop": ["ok", ""]}, "stop"),
    ],
)
def test_invalid_sampling_params(options, param):
    with pytest.raises(InvalidRequestError, match=param) as error:
        SamplingParams(**options)
    assert error.value.param == param
    assert isinstance(error.value, ValueError)  # callers catching ValueError still see it


def test_invalid_prompts(llm):
    too_long = {"prompt_token_ids": [5] * 100}
    with pytest.raises(
        InvalidRequestError, match=r"prompt \(100 tokens\) plus max_tokens \(40\) exceeds .* 128"
    ) as error:
        llm.generate(too_long, SamplingParams(max_tokens=40), use_tqdm=False)
    assert error.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError, match="exceeds"):
        llm.generate(
            {"prompt_token_ids": [5] * 128}, SamplingParams(max_tokens=None), use_tqdm=False
        )
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate({"prompt_token_ids": []}, GREEDY, use_tqdm=False)
    vocab_size = llm.engine.arch.vocab_size
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.generate({"prompt_token_ids": [1, vocab_size]}, GREEDY, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.generate({"prompt_token_ids": [-1]}, GREEDY, use_tqdm=False)


def test_a_rejected_prompt_leaves_nothing_behind(llm):
    # The valid prompts before the bad one must not linger in the engine and run with the next call.
    with pytest.raises(InvalidRequestError):
        llm.generate(["fine", "also fine", {"prompt_token_ids": []}], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests and not llm.engine.requests
    assert len(llm.generate("next", GREEDY, use_tqdm=False)) == 1


def test_invalid_engine_options(tiny_llama_dir):
    with pytest.raises(ValueError, match="dtype"):
        LLM(model=str(tiny_llama_dir), dtype="float8")
    with pytest.raises(ValueError, match="Cannot load model"):
        LLM(model="no/such/model")


def test_engine_snapshots_are_immutable_views_of_live_requests(llm):
    engine = llm.engine
    engine.add_request("snap", [1, 2, 3, 4, 5], SamplingParams(max_tokens=8, ignore_eos=True))
    assert engine.snapshot().num_waiting == 1 and engine.snapshot().requests == ()
    engine.step()
    snapshot = engine.snapshot(with_requests=True)
    request = snapshot.request("snap")
    assert (snapshot.num_running, snapshot.num_waiting, snapshot.num_requests) == (1, 0, 1)
    assert (
        request.status == "running"
        and request.num_prompt_tokens == 5
        and request.num_output_tokens == 1
    )
    assert (
        request.num_blocks == snapshot.num_blocks - snapshot.num_free_blocks
        and snapshot.kv_usage > 0
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.status = "finished"
    engine.abort("snap")
    assert engine.snapshot(with_requests=True) == EngineSnapshot(
        0, 0, 0, snapshot.num_blocks, snapshot.num_blocks
    )
    assert request.status == "running"  # the earlier snapshot did not change
