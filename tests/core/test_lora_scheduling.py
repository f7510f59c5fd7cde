"""``max_loras``: the running batch never holds more distinct LoRA adapters than the cap, requests
of other adapters wait their turn without holding up anyone else, and every request still gets
the tokens it gets without the cap."""

import pytest

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import SamplingParams

PROJECTIONS = ("q_proj", "v_proj", "down_proj")
# (lora name or None, prompt); prompts differ so that no request's tokens stand in for another's.
REQUESTS = [
    ("a", [1, 5, 9]),
    ("b", [1, 6, 10]),
    (None, [1, 7, 11]),
    ("a", [1, 8, 12]),
    ("b", [1, 4, 13]),
]


def _run(tiny_llama_dir, adapters, max_loras) -> tuple[dict[str, list[int]], list[set[str]]]:
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama_dir),
            dtype="float32",
            num_kv_blocks=64,
            enable_lora=True,
            max_lora_rank=8,
            max_loras=max_loras,
            lora_modules=adapters,
        )
    )
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for index, (lora_name, prompt) in enumerate(REQUESTS):
        engine.add_request(str(index), prompt, params, lora_name=lora_name)
    tokens, batches = {}, []
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids
        running = {r.lora_name for r in engine.scheduler.running if r.lora_name is not None}
        batches.append(running)
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    engine.shutdown()
    return tokens, batches


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, make_lora_adapter) -> dict[str, str]:
    return {
        name: str(make_lora_adapter(tiny_llama_dir, PROJECTIONS, seed=seed))
        for seed, name in enumerate("ab", start=5)
    }


def test_the_running_batch_holds_at_most_max_loras_adapters(tiny_llama_dir, adapters):
    free, free_batches = _run(tiny_llama_dir, adapters, None)
    capped, capped_batches = _run(tiny_llama_dir, adapters, 1)
    assert capped == free and len(capped) == len(REQUESTS)
    assert max(map(len, free_batches)) == 2  # without the cap both adapters run together
    assert max(map(len, capped_batches)) == 1
    assert {"a"} in capped_batches and {"b"} in capped_batches


def test_max_loras_must_be_positive():
    with pytest.raises(ValueError, match="max_loras must be at least 1"):
        EngineConfig(enable_lora=True, max_loras=0)
