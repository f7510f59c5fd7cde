"""LoRA adapters against PEFT on transformers: tiny random checkpoints, adapters made and saved by
PEFT with every LoRA weight drawn at random (so each projection's delta shows in the logits).

Greedy outputs are checked teacher-forced: transformers runs the prompt and the tokens the engine
chose in one forward, and at every position the engine's token must be that model's argmax (a
near-tie aside) and its logprob that model's within `LOGPROB_TOL`. Without a tie this is exactly
PEFT's greedy ``generate``, and it tests the logprob of every token, not only the choices.
"""

import itertools
from pathlib import Path

import pytest
import torch

from spyglass import LLM, LoRARequest, SamplingParams
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.loaders.load import load_checkpoint

LOGPROB_TOL = 1e-4
TIE = 1e-4
MAX_RANK = 8
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Case -> (model, PEFT LoraConfig options). "llama" is the tiny_llama_dir fixture; the others are
# `tiny_family_dir` families.
CASES = {
    "llama-all-seven": ("llama", dict(r=8, lora_alpha=16, target_modules=ALL_SEVEN)),
    # Per-module rank and alpha; the alpha key is a regex alternation, as PEFT allows.
    "llama-qv-rslora-patterns": (
        "llama",
        dict(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj"],
            use_rslora=True,
            rank_pattern={"v_proj": 8},
            alpha_pattern={r"layers\.0\.self_attn\.q_proj|layers\.1\.self_attn\.v_proj": 3},
        ),
    ),
    "qwen2-biases": ("qwen2-yarn", dict(r=8, lora_alpha=16, target_modules=ALL_SEVEN)),
    # The checkpoint stores qkv_proj and gate_up_proj fused: PEFT's deltas span all their rows.
    "phi3-fused": (
        "phi3",
        dict(r=8, lora_alpha=8, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
    ),
    "gemma2": ("gemma2", dict(r=4, lora_alpha=8, target_modules=ALL_SEVEN)),
    "mixtral-attention": (
        "mixtral",
        dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    ),
    "qwen2-moe-attention": (
        "qwen2-moe",
        dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    ),
}

_req_ids = itertools.count()


def peft_reference(base_dir: Path, adapter_dir: Path):
    """The PeftModel of ``adapter_dir`` on the checkpoint in ``base_dir``, in float32: the reference."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).eval()


def run(engine, requests, params=GREEDY):
    """Add every ``(prompt, lora_name)`` at once, step to the end checking the KV bookkeeping each
    step; the outputs in order. Every block is free again at the end."""
    req_ids = [f"lora-{next(_req_ids)}" for _ in requests]
    for req_id, (prompt, lora_name) in zip(req_ids, requests):
        engine.add_request(req_id, list(prompt), params, lora_name=lora_name)
    finished = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        engine.kv.check_integrity()
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    return [finished[req_id] for req_id in req_ids]


def reference_logprobs(reference, prompt: list[int], token_ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax at each output position of ``prompt + token_ids``, teacher-forced."""
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([prompt + token_ids])).logits
    return logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)


def assert_matches(reference, prompt: list[int], output, greedy: bool = True) -> None:
    """``output``'s tokens are ``reference``'s greedy choices (if ``greedy``) and their logprobs
    are ``reference``'s."""
    completion = output.outputs[0]
    logprobs = reference_logprobs(reference, prompt, completion.token_ids)
    for position, token in enumerate(completion.token_ids):
        want = float(logprobs[position, token])
        if greedy:
            best = int(logprobs[position].argmax())
            assert token == best or float(logprobs[position, best]) - want < TIE, (
                f"output position {position}: {token} where the reference picks {best}"
            )
        drift = abs(completion.logprobs[position].logprob - want)
        assert drift <= LOGPROB_TOL, f"output position {position}: logprob off by {drift:.2e}"


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir, tiny_family_dir):
    """``model_dir(name)``: the tiny checkpoint called ``name`` in `CASES`."""
    return lambda name: tiny_llama_dir if name == "llama" else tiny_family_dir(name)


@pytest.fixture(scope="module")
def make_lora_engine(model_dir, tiny_engine_factory):
    """``make(name, **options)``: an engine with LoRA on (rank up to `MAX_RANK`) on that tiny
    checkpoint, loaded once per module."""
    checkpoints = {}

    def make(name: str, **options):
        if name not in checkpoints:
            checkpoints[name] = load_checkpoint(str(model_dir(name)), torch.float32)
        options = {"enable_lora": True, "max_lora_rank": MAX_RANK, **options}
        return tiny_engine_factory(model_dir(name), checkpoints[name])(**options)

    return make


@pytest.fixture(scope="module")
def adapter(model_dir, make_lora_adapter):
    """``adapter(case, seed=0)``: a `CASES` adapter's directory and PeftModel, built once."""
    built = {}

    def make(case: str, seed: int = 0):
        if (case, seed) not in built:
            name, options = CASES[case]
            options = dict(options)
            path = make_lora_adapter(
                model_dir(name), options.pop("target_modules"), seed, **options
            )
            built[case, seed] = path, peft_reference(model_dir(name), path)
        return built[case, seed]

    return make


def two_llama_adapters(adapter):
    """The two llama adapters the batch tests mix: A on all seven projections, B on q and v with
    rslora and patterns; each as (directory, PEFT reference)."""
    return adapter("llama-all-seven"), adapter("llama-qv-rslora-patterns")


@pytest.fixture(scope="module")
def prompts(hf_gguf_tokenizer, mixed_texts) -> list[list[int]]:
    """Three prompts: short, past two blocks (and Gemma 2's 16-token window), medium."""
    token_ids = [hf_gguf_tokenizer(mixed_texts[i]).input_ids for i in (1, 4, 6)]
    assert len(token_ids[1]) > 32
    return token_ids


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_and_logprobs_match_peft(case, adapter, make_lora_engine, prompts):
    path, reference = adapter(case)
    engine = make_lora_engine(CASES[case][0])
    engine.add_lora("adapter", str(path))
    outputs = run(engine, [(p, "adapter") for p in prompts] + [(prompts[1], None)])
    for prompt, output in zip(prompts, outputs):
        assert_matches(reference, prompt, output)
    with reference.disable_adapter():  # the base request in the same batch: the base model's
        assert_matches(reference, prompts[1], outputs[-1])
    assert outputs[-1].outputs[0].token_ids != outputs[1].outputs[0].token_ids


def test_one_batch_mixing_base_and_two_adapters(adapter, make_lora_engine, prompts):
    # base, A, B, A, base: A's rows are two runs (an index tensor), B's one (a slice).
    (path_a, ref_a), (path_b, ref_b) = two_llama_adapters(adapter)
    engine = make_lora_engine("llama")
    engine.add_lora("a", str(path_a))
    engine.add_lora("b", str(path_b))
    requests = list(zip(prompts + prompts[:2], [None, "a", "b", "a", None]))
    mixed = run(engine, requests)
    alone = [run(engine, [request])[0] for request in requests]
    references = {None: ref_a, "a": ref_a, "b": ref_b}
    for (prompt, lora_name), together, single in zip(requests, mixed, alone):
        assert together.outputs[0].token_ids == single.outputs[0].token_ids
        if lora_name is None:
            with ref_a.disable_adapter():
                assert_matches(ref_a, prompt, together)
        else:
            assert_matches(references[lora_name], prompt, together)
    # One prompt on the base model and on A: two continuations.
    assert mixed[0].outputs[0].token_ids != mixed[3].outputs[0].token_ids
    assert mixed[1].outputs[0].token_ids != mixed[4].outputs[0].token_ids


def test_prefix_cache_is_keyed_by_adapter_and_load(
    adapter, tiny_llama_dir, hf_gguf_tokenizer, mixed_texts
):
    # Every installed plugin, as a user gets them: the prefix cache is among them.
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        enable_lora=True,
        max_lora_rank=MAX_RANK,
        kv_cache_memory="8MiB",
    )
    engine = llm.engine
    assert engine.plugin_manager.has_plugin("prefix_cache")
    (path_a, ref_a), (path_b, ref_b) = two_llama_adapters(adapter)
    prompt = hf_gguf_tokenizer(mixed_texts[4] + mixed_texts[7]).input_ids
    cached = (len(prompt) - 1) // engine.config.block_size * engine.config.block_size
    assert cached >= 3 * engine.config.block_size

    def generate(lora_request=None):
        [output] = llm.generate(
            {"prompt_token_ids": prompt}, GREEDY, use_tqdm=False, lora_request=lora_request
        )
        return output

    a = LoRARequest("a", 1, str(path_a))
    first, again = generate(a), generate(a)
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, cached)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert_matches(ref_a, prompt, again)
    # The base model's keys and values differ from A's for the same tokens: no reuse either way.
    base, base_again = generate(), generate()
    assert (base.num_cached_tokens, base_again.num_cached_tokens) == (0, cached)
    with ref_a.disable_adapter():
        assert_matches(ref_a, prompt, base)
    assert generate(a).num_cached_tokens == cached  # A's blocks survived the base requests
    # The same name loaded again from another adapter: a new load, new keys.
    engine.remove_lora("a")
    engine.add_lora("a", str(path_b))
    b_as_a = LoRARequest("a", 2, str(path_b))
    reloaded, reloaded_again = generate(b_as_a), generate(b_as_a)
    assert (reloaded.num_cached_tokens, reloaded_again.num_cached_tokens) == (0, cached)
    assert reloaded_again.outputs[0].token_ids == reloaded.outputs[0].token_ids
    assert_matches(ref_b, prompt, reloaded)
    assert not engine.has_unfinished_requests
    engine.kv.check_integrity()
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks


def test_reload_under_the_same_name_while_a_request_runs(adapter, make_lora_engine, prompts):
    (path_a, ref_a), (path_b, ref_b) = two_llama_adapters(adapter)
    engine = make_lora_engine("llama")
    engine.add_lora("a", str(path_a))
    engine.add_request("old", prompts[1], GREEDY, lora_name="a")
    engine.step()  # its prompt is in; it decodes from here
    engine.remove_lora("a")
    engine.add_lora("a", str(path_b))
    engine.add_request("new", prompts[2], GREEDY, lora_name="a")
    finished = {}
    while engine.has_unfinished_requests:
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert_matches(ref_a, prompts[1], finished["old"])
    assert_matches(ref_b, prompts[2], finished["new"])


def test_seeded_sampling_with_an_adapter_is_reproducible(adapter, make_lora_engine, prompts):
    path_a, ref_a = adapter("llama-all-seven")
    path_b, _ = adapter("llama-qv-rslora-patterns")
    engine = make_lora_engine("llama")
    engine.add_lora("a", str(path_a))
    engine.add_lora("b", str(path_b))
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True, logprobs=0)
    [alone] = run(engine, [(prompts[1], "a")], seeded)
    [again] = run(engine, [(prompts[1], "a")], seeded)
    # In a batch with other adapters' and the base model's rows, before and after it.
    batch = run(engine, [(prompts[0], "b"), (prompts[1], "a"), (prompts[1], None)], seeded)
    assert again.outputs[0].token_ids == alone.outputs[0].token_ids
    assert batch[1].outputs[0].token_ids == alone.outputs[0].token_ids
    assert_matches(ref_a, prompts[1], alone, greedy=False)
    other_seed = SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True)
    [other] = run(engine, [(prompts[1], "a")], other_seed)
    assert other.outputs[0].token_ids != alone.outputs[0].token_ids


def test_lora_modules_load_at_start(adapter, make_lora_engine, prompts):
    path, reference = adapter("llama-all-seven")
    engine = make_lora_engine("llama", lora_modules={"a": str(path)})
    [info] = engine.loras
    num_parameters = sum(p.numel() for n, p in reference.named_parameters() if "lora_" in n)
    assert (info.name, info.path, info.rank, info.num_parameters) == (
        "a",
        str(path),
        8,
        num_parameters,
    )
    [output] = run(engine, [(prompts[0], "a")])
    assert_matches(reference, prompts[0], output)
    engine.remove_lora("a")
    assert engine.loras == ()


# Adapter -> (model, PEFT LoraConfig options, what the refusal says).
REFUSED = {
    "rank-over-max": ("llama", dict(r=16, target_modules=["q_proj"]), "rank 16 is over"),
    "rank-pattern-over-max": (
        "llama",
        dict(r=4, target_modules=["q_proj", "down_proj"], rank_pattern={"down_proj": 12}),
        "rank 12 is over",
    ),
    "dora": ("llama", dict(r=4, target_modules=["q_proj"], use_dora=True), "DoRA"),
    "embed-tokens": ("llama", dict(r=4, target_modules=["embed_tokens"]), "embed_tokens"),
    "lm-head": ("llama", dict(r=4, target_modules=["lm_head"]), "lm_head"),
    "mixtral-experts": (
        "mixtral",
        dict(r=4, target_modules=[], target_parameters=["experts.gate_up_proj"]),
        "mixture-of-experts",
    ),
    "mixtral-router": ("mixtral", dict(r=4, target_modules=["gate"]), "mixture-of-experts"),
    # On transformers 5, PEFT maps gate_proj, up_proj and down_proj onto the stacked experts of
    # every sparse layer (and here the shared expert's modules too).
    "qwen3-moe-mlp": ("qwen3-moe", dict(r=4, target_modules=ALL_SEVEN), "mixture-of-experts"),
    "qwen2-moe-shared-expert": (
        "qwen2-moe",
        dict(r=4, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"]),
        "mixture-of-experts",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_adapters_that_cannot_run_exactly_are_refused(
    case, model_dir, make_lora_engine, make_lora_adapter, tmp_path
):
    name, options, message = REFUSED[case]
    options = dict(options)
    path = make_lora_adapter(model_dir(name), options.pop("target_modules"), **options)
    engine = make_lora_engine(name)
    with pytest.raises(ValueError, match=message):
        engine.add_lora("refused", str(path))
    assert engine.loras == ()
    with pytest.raises(ValueError, match="not a PEFT adapter directory"):
        engine.add_lora("refused", str(tmp_path / "missing"))


def test_requests_naming_no_loaded_adapter_are_refused(make_lora_engine, prompts):
    engine = make_lora_engine("llama")
    with pytest.raises(InvalidRequestError, match="no LoRA adapter named 'nope'") as refused:
        engine.add_request("unknown", prompts[0], GREEDY, lora_name="nope")
    assert refused.value.param == "model"
    engine = make_lora_engine("llama", enable_lora=False)
    with pytest.raises(InvalidRequestError, match="--enable-lora") as refused:
        engine.add_request("lora-off", prompts[0], GREEDY, lora_name="a")
    assert refused.value.param == "model"
    with pytest.raises(ValueError, match="--enable-lora"):
        engine.add_lora("a", "/nowhere")
    assert engine.loras == () and not engine.has_unfinished_requests


def test_config_refuses_lora_without_enable_lora_or_with_tensor_parallelism():
    with pytest.raises(ValueError, match="lora_modules need enable_lora"):
        EngineConfig(lora_modules={"a": "/adapters/a"})
    with pytest.raises(ValueError, match="tensor parallelism"):
        EngineConfig(enable_lora=True, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="max_lora_rank must be at least 1"):
        EngineConfig(enable_lora=True, max_lora_rank=0)
