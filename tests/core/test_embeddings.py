"""Embedding requests (``SamplingParams.pooling``) against transformers' ``last_hidden_state`` at
the last prompt token: on the default model beside generation, through chunked prefill,
preemption and the prefix cache; on the Gemma families; offline through ``LLM.embed``."""

from dataclasses import replace

import pytest
import torch

from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    SamplingParams,
    pooling_request_params,
)

EMBED = pooling_request_params(PoolingParams())
RAW = pooling_request_params(PoolingParams(normalize=False))


@pytest.fixture(scope="module")
def prompts(default_prompts):
    return default_prompts


def _last_hidden(hf_model, prompt: list[int]) -> torch.Tensor:
    """transformers' final-norm output at the prompt's last token, in float32."""
    with torch.inference_mode():
        return hf_model.model(torch.tensor([prompt])).last_hidden_state[0, -1].float()


@pytest.fixture(scope="module")
def reference(hf_default_model, prompts):
    return [_last_hidden(hf_default_model, p) for p in prompts]


def _assert_embeds(output, expected: torch.Tensor, normalize: bool = True) -> None:
    assert output.finished and output.outputs[0].finish_reason == "stop"
    assert output.outputs[0].token_ids == [] and output.outputs[0].text == ""
    vector = torch.tensor(output.pooled)
    if normalize:
        assert vector.norm().item() == pytest.approx(1.0, abs=1e-5)
        expected = torch.nn.functional.normalize(expected, dim=-1)
    torch.testing.assert_close(vector, expected, atol=2e-4 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("options", [{}, {"async_scheduling": True}], ids=["sync", "async"])
def test_embeddings_match_transformers_beside_generation(
    make_default_engine, run_engine, prompts, reference, options
):
    # Generation runs in the same steps: async steps are planned ahead while prompts are pooled.
    generate = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine = make_default_engine(**options)
    *embedded, generated = run_engine(engine, [*prompts, prompts[0]], [EMBED] * 3 + [generate])
    for output, expected in zip(embedded, reference, strict=True):
        _assert_embeds(output, expected)
    assert generated.pooled is None
    (alone,) = run_engine(make_default_engine(), [prompts[0]], generate)
    assert generated.outputs[0].token_ids == alone.outputs[0].token_ids


def test_unnormalized_vectors_are_the_final_hidden_state(
    make_default_engine, run_engine, prompts, reference
):
    outputs = run_engine(make_default_engine(), prompts, [RAW, EMBED, RAW])
    for output, expected, normalize in zip(outputs, reference, [False, True, False]):
        _assert_embeds(output, expected, normalize)
    assert torch.tensor(outputs[0].pooled).norm() > 2


def test_chunks_preemption_and_the_prefix_cache_give_the_same_vectors(
    make_cramped_engine, run_engine, prompts, reference, count_preemptions
):
    engine = make_cramped_engine()
    preemptions = count_preemptions(engine)
    first = run_engine(engine, prompts, EMBED)
    generate = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    *again, _, _ = run_engine(
        engine, [*prompts, prompts[2], prompts[1]], [EMBED] * 3 + [generate] * 2
    )
    assert preemptions.req_ids, "the KV budget was meant to force preemptions"
    assert any(o.num_cached_tokens for o in again), "repeated prompts were meant to hit the cache"
    for output in [*first, *again]:
        assert output.num_cached_tokens < len(output.prompt_token_ids)
    for outputs in (first, again):
        for output, expected in zip(outputs, reference, strict=True):
            _assert_embeds(output, expected)


def test_a_prompt_as_long_as_the_context_is_embedded(make_default_engine, run_engine, prompts):
    engine = make_default_engine(max_model_len=len(prompts[2]))
    (output,) = run_engine(engine, [prompts[2]], EMBED)
    assert len(output.pooled) == engine.arch.hidden_size
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request("long", prompts[2] + [1], EMBED)
    assert error.value.param == "prompt"


def test_other_dimensions_are_refused(make_default_engine, run_engine, prompts):
    engine = make_default_engine()
    hidden = engine.arch.hidden_size
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request(
            "short", prompts[0], pooling_request_params(PoolingParams(dimensions=64))
        )
    assert error.value.param == "dimensions"
    (output,) = run_engine(
        engine, [prompts[0]], pooling_request_params(PoolingParams(dimensions=hidden))
    )
    assert len(output.pooled) == hidden


def test_truncated_prompts_embed_their_last_tokens(make_default_engine, run_engine, prompts):
    engine = make_default_engine()
    truncated = replace(EMBED, truncate_prompt_tokens=10)
    cut, whole = run_engine(engine, [prompts[2], prompts[2][-10:]], [truncated, EMBED])
    assert cut.prompt_token_ids == prompts[2][-10:]
    torch.testing.assert_close(torch.tensor(cut.pooled), torch.tensor(whole.pooled))


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "qwen3"])
def test_other_families_match_transformers(tiny_family_dir, mixed_texts, name):
    from transformers import AutoModelForCausalLM

    from spyglass.core.llm import LLM

    path = tiny_family_dir(name)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    token_ids = [llm.get_tokenizer().encode(text) for text in mixed_texts[:3]]
    outputs = llm.embed([{"prompt_token_ids": t} for t in token_ids], use_tqdm=False)
    for output, prompt in zip(outputs, token_ids, strict=True):
        assert output.prompt_token_ids == prompt
        expected = torch.nn.functional.normalize(_last_hidden(theirs, prompt), dim=-1)
        torch.testing.assert_close(
            torch.tensor(output.outputs.embedding), expected, atol=1e-4, rtol=0
        )


def test_llm_embed_keeps_the_order_of_its_prompts(tiny_llama_dir):
    from transformers import AutoModel

    from spyglass.core.llm import LLM

    theirs = AutoModel.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    llm = LLM(model=str(tiny_llama_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    texts = ["a short one", "a somewhat longer sentence about foxes and the sea", "x"]
    outputs = llm.embed(texts, PoolingParams(normalize=False), use_tqdm=False)
    assert [o.outputs.hidden_size for o in outputs] == [llm.engine.arch.hidden_size] * 3
    for output, text in zip(outputs, texts, strict=True):
        ids = llm.get_tokenizer().encode(text)
        with torch.inference_mode():
            expected = theirs(torch.tensor([ids])).last_hidden_state[0, -1]
        torch.testing.assert_close(
            torch.tensor(output.outputs.embedding), expected, atol=1e-4, rtol=0
        )
    assert llm.engine.kv.pool.num_free_blocks == llm.engine.kv.pool.num_blocks


def test_an_adapter_changes_the_vector_as_peft_does(tiny_llama_dir, make_lora_adapter):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from spyglass.core.engine.lora_info import LoRARequest
    from spyglass.core.llm import LLM

    path = make_lora_adapter(tiny_llama_dir, ["q_proj", "v_proj", "down_proj"])
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    theirs = PeftModel.from_pretrained(base, path).eval()
    llm = LLM(
        model=str(tiny_llama_dir),
        dtype="float32",
        device="cpu",
        kv_cache_memory="64MiB",
        enable_lora=True,
    )
    ids = llm.get_tokenizer().encode("A fox in a forest by the sea")
    prompt = {"prompt_token_ids": ids}
    adapted, plain = llm.embed(
        [prompt, prompt], use_tqdm=False, lora_request=[LoRARequest("a", 1, str(path)), None]
    )
    with torch.inference_mode():
        expected = theirs.base_model.model.model(torch.tensor([ids])).last_hidden_state[0, -1]
    expected = torch.nn.functional.normalize(expected, dim=-1)
    torch.testing.assert_close(torch.tensor(adapted.outputs.embedding), expected, atol=1e-4, rtol=0)
    assert _cosine_distance(adapted.outputs.embedding, plain.outputs.embedding) > 1e-3


def _cosine_distance(a: list[float], b: list[float]) -> float:
    return 1 - torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=0).item()


def test_llm_score_gives_cosine_similarities_in_every_pairing(tiny_llama_dir):
    from transformers import AutoModel

    from spyglass.core.llm import LLM

    theirs = AutoModel.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    llm = LLM(model=str(tiny_llama_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    tokenizer = llm.get_tokenizer()

    def cosine(a: str, b: str) -> float:
        with torch.inference_mode():
            vectors = [
                theirs(torch.tensor([tokenizer.encode(t)])).last_hidden_state[0, -1] for t in (a, b)
            ]
        return torch.nn.functional.cosine_similarity(*vectors, dim=0).item()

    query, documents = "foxes", ["a fox den", "stock prices", "foxes"]
    one_to_many = llm.score(query, documents, use_tqdm=False)
    assert [o.outputs.score for o in one_to_many] == pytest.approx(
        [cosine(query, d) for d in documents], abs=1e-5
    )
    assert one_to_many[2].outputs.score == pytest.approx(1.0, abs=1e-6)
    assert one_to_many[0].prompt_token_ids == tokenizer.encode(query) + tokenizer.encode(
        documents[0]
    )
    pairwise = llm.score(documents[:2], documents[1:], use_tqdm=False)
    assert [o.outputs.score for o in pairwise] == pytest.approx(
        [cosine(documents[0], documents[1]), cosine(documents[1], documents[2])], abs=1e-5
    )
    with pytest.raises(InvalidRequestError) as error:
        llm.score(documents[:2], documents, use_tqdm=False)
    assert error.value.param == "text_1"
