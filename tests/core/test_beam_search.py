"""Beam search (`LLM.beam_search`, `core.engine.beam_search`) against transformers' own beam search
on the tiny random Llama, and its bookkeeping of EOS, length penalty and the context."""

import pytest

from spyglass import LLM
from spyglass.core.engine.beam_search import BeamSearch, BeamSearchParams

PROMPTS = [[1, 450, 4996, 17354, 1701], [1, 22, 33, 44]]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    engine = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory="32MiB")
    return engine


@pytest.mark.parametrize("width", [1, 3, 5])
def test_beams_match_transformers_beam_search(llm, hf_beams, width):
    params = BeamSearchParams(beam_width=width, max_tokens=6, ignore_eos=True)
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        ours = [beam.tokens[len(prompt) :] for beam in output.sequences]
        assert ours == hf_beams(prompt, width, 6)
        scores = [beam.cum_logprob for beam in output.sequences]
        assert scores == sorted(scores, reverse=True)
        tokenizer = llm.get_tokenizer()
        assert [b.text for b in output.sequences] == [tokenizer.decode(t) for t in ours]
    # Every round's one-token requests are gone, with their blocks.
    pool = llm.engine.kv.pool
    assert not llm.engine.has_unfinished_requests and pool.num_free_blocks == pool.num_blocks


def test_width_one_is_greedy(llm):
    from spyglass import SamplingParams

    [beam] = llm.beam_search(
        ["Once upon a time"], BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True)
    )[0].sequences
    [greedy] = llm.generate(
        ["Once upon a time"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    assert beam.text == greedy.outputs[0].text


def test_eos_finishes_a_beam_and_the_penalty_ranks_by_length():
    params = BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=1.0)
    search = BeamSearch([7, 8], params, eos_token_ids=(2,), max_model_len=100)
    search.advance([{2: -0.1, 5: -0.5, 6: -0.7}])  # EOS is the likeliest first token
    assert [b.tokens for b in search.finished] == [[7, 8, 2]]
    assert [b.tokens for b in search.live] == [[7, 8, 5], [7, 8, 6]]
    search.advance([{9: -0.1}, {9: -0.2}])
    search.advance([{4: -0.1}, {4: -0.1}])
    assert search.done
    best = search.best()
    # -0.1 over 2 tokens beats -0.7 over 5: the finished beam (its EOS not counted) first.
    assert [b.finish_reason for b in best] == ["stop", "length"]
    assert search.generated(best[0]) == []
    assert search.generated(best[1]) == [5, 9, 4]


def test_ignore_eos_keeps_eos_beams_going_and_the_context_ends_the_search():
    params = BeamSearchParams(beam_width=1, max_tokens=10, ignore_eos=True)
    search = BeamSearch([7], params, eos_token_ids=(2,), max_model_len=3)
    search.advance([{2: -0.1}])
    assert not search.finished and search.live[0].tokens == [7, 2]
    search.advance([{3: -0.1}])
    assert search.done  # the beam fills the 3-token context
    assert BeamSearchParams(beam_width=1, max_tokens=1)
    with pytest.raises(ValueError, match="at least 1"):
        BeamSearchParams(beam_width=0, max_tokens=4)
