"""Every model family against transformers on a tiny random checkpoint, loaded through the real loader.

Per family: the config is read as transformers reads it; prefill logits for a batch of prompts match
transformers' in float32 (through the compiled CPU kernels and the torch reference); greedy continuations
of 8 prompts, several longer than the 16-token sliding window, match ``generate`` token for token.
"""

import dataclasses

import pytest
import torch

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.loaders.load import load_checkpoint
from spyglass.core.models.attention_metadata import AttentionMetadata
from spyglass.core.models.quantization import quantize_int8
from spyglass.core.models.registry import build_model
from spyglass.kernels import torch_moe
from spyglass.kernels.backend import select_backend

NUM_TOKENS = 8
TIE = 1e-4
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=2)

# What each family's config must turn into (beyond the shape every family shares).
EXPECTED_ARCH = {
    "qwen2-yarn": dict(architecture="qwen2", attention_bias=True, sliding_window=None),
    "qwen3": dict(architecture="qwen3", qk_norm=True, head_dim=16),
    "mistral": dict(architecture="mistral", sliding_window=16, layer_types=()),
    "phi3": dict(architecture="phi3", max_position_embeddings=1024),
    "gemma2": dict(
        architecture="gemma2",
        hidden_act="gelu_pytorch_tanh",
        sliding_window=16,
        layer_types=("sliding_attention", "full_attention"),
        attn_logit_softcapping=1.0,
        final_logit_softcapping=2.0,
        query_pre_attn_scalar=16,
    ),
    "gemma3": dict(
        architecture="gemma3",
        qk_norm=True,
        rope_theta=1000000.0,
        local_rope_theta=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    ),
    "mixtral": dict(
        architecture="mixtral",
        num_experts=4,
        num_experts_per_tok=2,
        moe_layers=(0, 1),
        norm_topk_prob=True,
    ),
    "qwen2-moe": dict(
        architecture="qwen2_moe",
        num_experts=4,
        shared_expert_intermediate_size=64,
        moe_layers=(0, 1),
        norm_topk_prob=False,
        attention_bias=True,
    ),
    "qwen3-moe": dict(
        architecture="qwen3_moe", num_experts=8, moe_layers=(0,), norm_topk_prob=True, qk_norm=True
    ),
}


@pytest.fixture(scope="module", params=list(EXPECTED_ARCH))
def family(request, tiny_family_dir):
    """(name, directory, our float32 checkpoint, transformers' float32 model) for one family."""
    from transformers import AutoModelForCausalLM

    path = tiny_family_dir(request.param)
    checkpoint = load_checkpoint(str(path), torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, checkpoint, theirs


@pytest.fixture(scope="module")
def prompts(family, mixed_texts) -> list[list[int]]:
    token_ids = [family[2].tokenizer.encode(text) for text in mixed_texts]
    assert sum(len(t) > 2 * 16 for t in token_ids) >= 3
    return token_ids


def test_config_reads_as_transformers_does(family):
    name, _, checkpoint, _ = family
    arch = checkpoint.arch
    for field, value in EXPECTED_ARCH[name].items():
        assert getattr(arch, field) == value, field
    shape = (
        arch.hidden_size,
        arch.num_hidden_layers,
        arch.num_attention_heads,
        arch.num_key_value_heads,
    )
    assert shape == (64, 2, 4, 2)


def _prefill_metadata(prompts: list[list[int]], block_size: int) -> AttentionMetadata:
    """Every prompt a fresh prefill, request r in its own consecutive blocks."""
    blocks = [-(-len(p) // block_size) for p in prompts]
    tables = torch.zeros(len(prompts), max(blocks), dtype=torch.int32)
    slots, first = [], 0
    for r, (prompt, count) in enumerate(zip(prompts, blocks)):
        tables[r, :count] = torch.arange(first, first + count)
        slots.append(first * block_size + torch.arange(len(prompt)))
        first += count
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.cat(slots),
        block_tables=tables,
        context_lens=lens,
        query_start_loc=torch.cat(
            [torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)]
        ),
        max_query_len=int(lens.max()),
        max_context_len=int(lens.max()),
    ), first


@pytest.mark.parametrize("backend_name", ["cpu", "torch"])
@torch.inference_mode()
def test_prefill_logits_match_transformers(family, prompts, backend_name):
    _, _, checkpoint, theirs = family
    arch, block_size = checkpoint.arch, 16
    backend = select_backend(torch.device("cpu"), backend_name)
    model = build_model(arch, checkpoint.weights, backend, torch.device("cpu"))
    meta, num_blocks = _prefill_metadata(prompts, block_size)
    shape = backend.cache_shape(num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(arch.num_hidden_layers)]
    input_ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    logits = model.forward(input_ids, positions, meta, caches, torch.arange(len(input_ids)))
    for prompt, ours in zip(prompts, logits.split([len(p) for p in prompts])):
        expected = theirs(torch.tensor([prompt])).logits[0].float()
        # The logits must vary, or agreeing with them would prove little.
        assert expected.std() > 0.1
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_greedy_continuations_match_transformers(family, prompts, run_engine, tiny_engine_factory):
    _, path, checkpoint, theirs = family
    outputs = run_engine(tiny_engine_factory(path, checkpoint)(), prompts, GREEDY)
    num_compared = 0
    for prompt, output in zip(prompts, outputs):
        input_ids = torch.tensor([prompt])
        generated = theirs.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=NUM_TOKENS,
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
        want = generated.sequences[0, len(prompt) :].tolist()
        logprobs = torch.cat(generated.logits).float().log_softmax(dim=-1)
        top = logprobs.topk(2, dim=-1).values
        ties = ((top[:, 0] - top[:, 1]) < TIE).nonzero()
        end = int(ties[0]) if len(ties) else NUM_TOKENS
        completion = output.outputs[0]
        assert completion.token_ids[:end] == want[:end]
        for position in range(end):
            assert completion.logprobs[position].logprob == pytest.approx(
                float(logprobs[position, want[position]]), abs=1e-4
            )
        num_compared += end
    assert num_compared >= len(prompts) * NUM_TOKENS * 3 // 4


def test_the_halves_cuda_graphs_run_give_the_same_tokens(
    family, prompts, run_engine, tiny_engine_factory, eager_graphs, same_greedy
):
    # Hidden states over padded rows (what a graph captures), then the final norm, head and any
    # soft-cap on the sampled rows: every family, decode and verify steps (n-gram drafts, which
    # are proposed only for requests that want no logprobs), and prompt chunks among them packed.
    _, path, checkpoint, _ = family
    make = tiny_engine_factory(path, checkpoint)
    reference = run_engine(make(), prompts, GREEDY)
    engine = make(
        plugins=["fcfs", "ngram"],
        speculative="ngram",
        num_speculative_tokens=3,
        max_num_seqs=16,
        max_num_batched_tokens=48,
    )
    graphs = eager_graphs(engine, rows_per_request=(1, 4), token_buckets=(32, 48))
    outputs = run_engine(engine, prompts, dataclasses.replace(GREEDY, logprobs=None))
    for expected, actual in zip(reference, outputs):
        same_greedy(expected, actual)
    rows = {shape.rows for shape in graphs.replayed}
    assert {0, 4} <= rows  # prompt chunks ran packed, verify steps padded


@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe"])
@torch.inference_mode()
def test_moe_dense_path_equals_grouped(tiny_family_dir, name):
    # The dense path only runs inside a CUDA-graph capture; here both run on the same routing.
    checkpoint = load_checkpoint(str(tiny_family_dir(name)), torch.float32)
    backend = select_backend(torch.device("cpu"), "torch")
    model = build_model(checkpoint.arch, checkpoint.weights, backend, torch.device("cpu"))
    moe = model.layers[0].mlp
    x = torch.randn(37, checkpoint.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    weights, chosen = moe.route(x)
    assert len(chosen.unique()) > 1
    args = (x, moe.w13, moe.w2, weights, chosen, moe.activation)
    torch.testing.assert_close(torch_moe.dense_experts(*args), torch_moe.fused_experts(*args))


@torch.inference_mode()
def test_moe_with_quantized_experts_runs_each_expert_in_blocks(tiny_family_dir):
    # Experts kept in GGUF blocks take the per-expert loop; int8 activations keep it close to the float layer.
    checkpoint = load_checkpoint(str(tiny_family_dir("qwen2-moe")), torch.float32)
    backend = select_backend(torch.device("cpu"), "cpu")
    quantized = {
        n: quantize_int8(w) if ".experts." in n else w for n, w in checkpoint.weights.items()
    }
    moe = build_model(checkpoint.arch, quantized, backend, torch.device("cpu")).layers[0].mlp
    reference = (
        build_model(checkpoint.arch, checkpoint.weights, backend, torch.device("cpu")).layers[0].mlp
    )
    assert moe.w13 is None and reference.experts is None
    x = torch.randn(19, checkpoint.arch.hidden_size, generator=torch.Generator().manual_seed(1))
    want = reference(x, backend)
    assert (moe(x, backend) - want).norm() / want.norm() < 5e-2


# Our tiny families with a llama.cpp architecture, and that architecture (the tiny Qwen3-MoE has a dense
# layer, which llama.cpp's qwen3moe cannot express, so its all-sparse twin stands in). Mistral and
# Mixtral are llama.cpp's "llama".
GGUF_ARCHITECTURES = {
    "qwen2-yarn": "qwen2",
    "qwen3": "qwen3",
    "qwen2-moe": "qwen2moe",
    "qwen3-moe-sparse": "qwen3moe",
    "mistral": "llama",
    "mixtral": "llama",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
}


@pytest.mark.parametrize("name", GGUF_ARCHITECTURES)
@torch.inference_mode()
def test_gguf_loads_as_the_hf_directory_does(
    name, tiny_family_dir, gguf_from_hf, tmp_path, mixed_texts
):
    hf_dir = tiny_family_dir(name)
    path = gguf_from_hf(hf_dir, GGUF_ARCHITECTURES[name], tmp_path / f"{name}.gguf")
    # Same weights and the same architecture as the directory, so the same outputs, checked above.
    ours, expected = (
        load_checkpoint(str(path), torch.float32),
        load_checkpoint(str(hf_dir), torch.float32),
    )
    assert ours.weights.keys() == expected.weights.keys()
    for weight_name, tensor in expected.weights.items():
        # Gemma's norms come back from 1 + w, which float32 rounds (to within an ulp of 1).
        tolerance = (
            2**-23 if name.startswith("gemma") and weight_name.endswith("norm.weight") else 0
        )
        torch.testing.assert_close(
            ours.weights[weight_name], tensor, rtol=0, atol=tolerance, msg=weight_name
        )
    # GGUF stores the norm epsilon as a float32.
    assert ours.arch.rms_norm_eps == pytest.approx(expected.arch.rms_norm_eps, rel=1e-6)
    assert dataclasses.replace(ours.arch, rms_norm_eps=expected.arch.rms_norm_eps) == expected.arch
    # And directly: the GGUF checkpoint's prefill logits against transformers' on the HF directory,
    # for a short prompt and one longer than the 16-token window.
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    model = build_model(
        ours.arch, ours.weights, select_backend(torch.device("cpu"), "torch"), torch.device("cpu")
    )
    prompts = [ours.tokenizer.encode(text) for text in (mixed_texts[1], mixed_texts[4])]
    meta, num_blocks = _prefill_metadata(prompts, 16)
    shape = model.backend.cache_shape(
        num_blocks, 16, ours.arch.num_key_value_heads, ours.arch.head_dim
    )
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(ours.arch.num_hidden_layers)]
    input_ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    logits = model.forward(input_ids, positions, meta, caches, torch.arange(len(input_ids)))
    for prompt, got in zip(prompts, logits.split([len(p) for p in prompts])):
        torch.testing.assert_close(
            got, theirs(torch.tensor([prompt])).logits[0].float(), rtol=1e-4, atol=1e-4
        )


def test_gguf_mixtral_with_per_expert_tensors(tiny_family_dir, gguf_from_hf, tmp_path):
    # Older llama.cpp Mixtral files hold one tensor per expert (blk.N.ffn_gate.E) instead of a 3-D stack.
    hf_dir = tiny_family_dir("mixtral")
    path = gguf_from_hf(hf_dir, "llama", tmp_path / "mixtral.gguf", per_expert=True)
    ours, expected = (
        load_checkpoint(str(path), torch.float32),
        load_checkpoint(str(hf_dir), torch.float32),
    )
    assert ours.weights.keys() == expected.weights.keys()
    for weight_name, tensor in expected.weights.items():
        assert torch.equal(ours.weights[weight_name], tensor), weight_name


def test_transformers_reads_our_gguf_writer_back(tiny_family_dir, gguf_from_hf, tmp_path):
    # The test writer follows llama.cpp's converter: transformers' own GGUF reader (which handles qwen2
    # at these shapes, not the others) gets the original weights back.
    from transformers import AutoModelForCausalLM

    hf_dir = tiny_family_dir("qwen2-yarn")
    path = gguf_from_hf(hf_dir, "qwen2", tmp_path / "qwen2.gguf")
    original = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    ).state_dict()
    assert theirs.keys() == original.keys()
    for weight_name, tensor in original.items():
        assert torch.equal(theirs[weight_name], tensor), weight_name
