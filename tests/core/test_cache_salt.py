"""``cache_salt``: the prefix cache shares blocks only between requests of one salt (or none)."""

import pytest

from spyglass import LLM, SamplingParams

PROMPT = list(range(100, 164))  # four full blocks of 16


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    engine = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory="32MiB")
    assert engine.engine.plugin_manager.has_plugin("prefix_cache")
    return engine


def _cached(llm, salt: str | None) -> tuple[int, list[int]]:
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, cache_salt=salt)
    [output] = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)
    return output.num_cached_tokens, output.outputs[0].token_ids


def test_blocks_are_shared_within_a_salt_only(llm):
    first, tokens = _cached(llm, "tenant-a")
    assert first == 0
    again, same = _cached(llm, "tenant-a")
    assert again == 48 and same == tokens  # every full block but the one with the last token
    assert _cached(llm, "tenant-b")[0] == 0
    assert _cached(llm, None)[0] == 0  # unsalted requests do not see a salt's blocks
    assert _cached(llm, None)[0] == 48  # but share theirs
    assert _cached(llm, "tenant-b")[0] == 48
    pool = llm.engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
