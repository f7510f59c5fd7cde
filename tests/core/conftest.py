"""Engine-test fixtures: engines built on shared checkpoints, a driver that runs them to completion,
a preemption counter."""

import dataclasses
import itertools
import math
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.penalty_counts import PendingTokens
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.load import load_checkpoint

_req_ids = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Run each module's models on one intra-op thread, then restore the previous count.

    These models are small and the test machines' few cores are shared: with more threads,
    tiny ops spend far more time synchronising than computing (measured 7x to 25x slower).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class PreemptionCounter:
    """A plugin that records every preemption the engine announces."""

    def __init__(self):
        self.req_ids: list[str] = []

    @hookimpl
    def spyglass_request_preempted(self, request):
        """Record the preempted request's id."""
        self.req_ids.append(request.req_id)


ON_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)
"""A ``device`` parameter for tests that also run on a GPU where there is one."""


def pending_tokens(
    batch: list[Request], rng: random.Random, device: str, vocab_size: int
) -> tuple[PendingTokens, dict[str, int]]:
    """A step in flight that sampled a token for some of ``batch`` (async scheduling): its ids,
    as the device holds them, with other requests' ids between; each pending token by request."""
    tokens = {r.req_id: rng.randrange(vocab_size) for r in batch if rng.random() < 0.6}
    ids, index = [], {}
    for req_id, token_id in tokens.items():
        ids.append(rng.randrange(vocab_size))  # another request's sampled id
        index[req_id] = len(ids)
        ids.append(token_id)
    return PendingTokens(torch.tensor(ids, dtype=torch.long, device=device), index), tokens


def outputs_by_step(
    engine: LLMEngine,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    kind: RequestOutputKind,
) -> dict[str, list[RequestOutput]]:
    """Every output of every request (``r0``, ``r1``, ...) of ``kind``, in order, from one engine;
    the KV pool is whole at the end and no request's text or sent counts are left behind."""
    outputs: dict[str, list[RequestOutput]] = {}
    for index, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{index}", list(prompt), dataclasses.replace(p, output_kind=kind))
        outputs[f"r{index}"] = []
    while engine.has_unfinished_requests:
        for output in engine.step():
            outputs[output.request_id].append(output)
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    assert not engine.outputs.detokenizers and not engine.outputs._sent
    return outputs


def run_to_completion(
    engine: LLMEngine,
    prompts: Sequence[list[int]],
    params: SamplingParams | Sequence[SamplingParams],
    check_integrity: bool = True,
    max_steps: int = 5000,
) -> list[RequestOutput]:
    """Add every prompt at once, step until all finish (checking the KV bookkeeping each step); outputs in order."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    req_ids = [f"req-{next(_req_ids)}" for _ in prompts]
    for req_id, prompt, p in zip(req_ids, prompts, params, strict=True):
        engine.add_request(req_id, list(prompt), p)
    finished: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests:
            break
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        if check_integrity:
            engine.kv.check_integrity()
    assert not engine.has_unfinished_requests, f"not done after {max_steps} steps"
    assert engine.kv.pool.num_free_blocks == engine.kv.pool.num_blocks
    return [finished[req_id] for req_id in req_ids]


def with_stop_strings(
    engine: LLMEngine, prompts: Sequence[list[int]], params: list[SamplingParams]
) -> list[SamplingParams]:
    """``params`` run once on ``engine``; every other request whose text is long enough then gets
    a stop string from it (characters 8 to 11), so that it ends part-way."""
    mixed = list(params)
    for index, output in enumerate(run_to_completion(engine, prompts, mixed)):
        text = output.outputs[0].text
        if index % 2 == 0 and len(text) > 12:
            mixed[index] = dataclasses.replace(mixed[index], stop=[text[8:11]])
    return mixed


def completion_fields(output: RequestOutput) -> tuple:
    """What a client sees of a finished request: token ids, text, finish and stop reasons, logprobs."""
    completion = output.outputs[0]
    logprobs = None if completion.logprobs is None else [lp.logprob for lp in completion.logprobs]
    return (
        completion.token_ids,
        completion.text,
        completion.finish_reason,
        completion.stop_reason,
        logprobs,
    )


def teacher_forced_agreement(
    engine: LLMEngine, prompts: Sequence[list[int]], reference: Sequence[RequestOutput]
) -> tuple[int, int]:
    """At each position of each ``reference`` output, whether ``engine`` given the same context
    (the prompt and the reference's tokens before it) picks the same next token greedily; (how many
    agree, how many positions). Unlike free-running agreement, one flipped near-tie costs one
    position, not the rest of the text."""
    contexts, expected = [], []
    for prompt, output in zip(prompts, reference, strict=True):
        tokens = output.outputs[0].token_ids
        for position, token in enumerate(tokens):
            contexts.append(list(prompt) + tokens[:position])
            expected.append(token)
    next_token = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    predicted = run_to_completion(engine, contexts, next_token)
    agreeing = sum(o.outputs[0].token_ids[0] == t for o, t in zip(predicted, expected, strict=True))
    return agreeing, len(expected)


@pytest.fixture(scope="session")
def tiny_llama_checkpoint(tiny_llama_dir) -> Checkpoint:
    """The tiny random Llama, loaded once through the real HF-directory loader in float32."""
    return load_checkpoint(str(tiny_llama_dir), torch.float32)


def _engine_factory(path, checkpoint: Checkpoint) -> Callable[..., LLMEngine]:
    def make(**options) -> LLMEngine:
        options = {
            "dtype": "float32",
            "device": "cpu",
            "plugins": ["fcfs"],
            "num_kv_blocks": 256,
            **options,
        }
        return LLMEngine(EngineConfig(model=str(path), **options), checkpoint=checkpoint)

    return make


@pytest.fixture(scope="session")
def tiny_engine_factory() -> Callable[..., Callable[..., LLMEngine]]:
    """``factory(path, checkpoint)``: builds engines on that tiny checkpoint (float32, CPU, only the fcfs
    plugin); keyword arguments of the engines it returns go to EngineConfig."""
    return _engine_factory


@pytest.fixture(scope="session")
def make_tiny_engine(tiny_llama_dir, tiny_llama_checkpoint) -> Callable[..., LLMEngine]:
    """Build an engine on the tiny Llama (see `tiny_engine_factory`)."""
    return _engine_factory(tiny_llama_dir, tiny_llama_checkpoint)


# Prompts of every kind: 1 to ~130 tokens, English, Chinese, code, numbers.
MIXED_TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "Once upon a time, in a land far away, there lived a king who loved numbers. " * 3,
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144,",
    "Q: What is the capital of France?\nA:",
    "import numpy as np\n\nx = np.arange(10)\nfor i in range(len(x)):\n    print(x[i] ** 2)\n" * 2,
]


# Three prompts of the default model (about 15, 20 and 60 tokens): prose, code, and one long
# enough for chunks of 16 and a cramped KV cache to split and preempt.
SCORING_TEXTS = [
    "The capital of France is Paris, and the capital of Italy is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time there was a little fox who lived in a forest near the sea. " * 3,
]


# The default model in 8-token blocks, 14 of them, and 16-token steps: `SCORING_TEXTS` are
# prefilled in chunks and, with generation alongside, preempted; the prefix cache is on.
CRAMPED = dict(
    plugins=["fcfs", "prefix_cache"], block_size=8, num_kv_blocks=14, max_num_batched_tokens=16
)


@pytest.fixture(scope="session")
def make_cramped_engine(make_default_engine) -> Callable[..., LLMEngine]:
    """``make_default_engine`` with the `CRAMPED` settings (and any others given)."""
    return lambda **options: make_default_engine(**CRAMPED, **options)


@pytest.fixture(scope="session")
def default_prompts(default_checkpoint) -> list[list[int]]:
    """`SCORING_TEXTS` as the default model's token ids: prompts whose every position's output
    the prompt-logprob and pooling tests check against transformers."""
    return [default_checkpoint.tokenizer.encode(text) for text in SCORING_TEXTS]


@pytest.fixture(scope="session")
def mixed_texts() -> list[str]:
    """Eight varied prompts (one of 1-3 tokens, several past 64): the engine and family tests' batch."""
    return MIXED_TEXTS


@pytest.fixture(scope="session")
def make_default_engine(default_model_path, default_checkpoint) -> Callable[..., LLMEngine]:
    """Build an engine on the real default model (float32, CPU, only the fcfs plugin), reusing its loaded weights."""

    def make(**options) -> LLMEngine:
        options = {
            "dtype": "float32",
            "device": "cpu",
            "plugins": ["fcfs"],
            "num_kv_blocks": 128,
            **options,
        }
        return LLMEngine(
            EngineConfig(model=str(default_model_path), **options), checkpoint=default_checkpoint
        )

    return make


@pytest.fixture(scope="session")
def hf_default_model(default_model_path):
    """transformers' own model for the default GGUF, in float32: the reference for parity tests."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        default_model_path.parent, gguf_file=default_model_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def run_engine() -> Callable[..., list[RequestOutput]]:
    """`run_to_completion`: add prompts, step to the end checking integrity, return outputs in order."""
    return run_to_completion


@pytest.fixture(scope="session")
def count_preemptions() -> Callable[[LLMEngine], PreemptionCounter]:
    """Register a fresh `PreemptionCounter` on an engine's plugin manager and return it."""

    def attach(engine: LLMEngine) -> PreemptionCounter:
        counter = PreemptionCounter()
        engine.plugin_manager.register(counter)
        return counter

    return attach


def assert_same_greedy(
    expected: RequestOutput, actual: RequestOutput, tie: float = 1e-4, logprob_tol: float = 1e-4
) -> bool:
    """Assert two greedy runs of one prompt agree; returns True if they parted at a near-tie.

    ``expected`` needs ``logprobs >= 2``, and ``actual`` too unless it asked for none. Up to where
    they part, the sampled tokens' logprobs must agree within ``logprob_tol``: float32 sums taken in
    another order move them by about 1e-6, while a real bug (a wrong mask, a stale KV slot) moves
    them far more, even on a random model whose near-uniform logits rarely let it change a token.
    They may part only where ``expected``'s top two logprobs differ by less than ``tie``: such a
    choice can flip, and the runs legitimately differ after it.
    """
    ours, theirs = expected.outputs[0], actual.outputs[0]
    for position, (want, got) in enumerate(zip(ours.token_ids, theirs.token_ids)):
        if want != got:
            first, second = sorted(ours.logprobs[position].top.values(), reverse=True)[:2]
            assert first - second < tie, (
                f"request {actual.request_id} differs at output position {position} ({got} instead of {want}) "
                f"where the top two logprobs are {first - second:.2e} apart"
            )
            return True
        if not theirs.logprobs:  # a run that asked for none (speculation needs that): tokens only
            continue
        drift = abs(ours.logprobs[position].logprob - theirs.logprobs[position].logprob)
        assert drift <= logprob_tol, (
            f"request {actual.request_id}: the logprob of output token {position} moved by {drift:.2e}"
        )
    assert theirs.token_ids == ours.token_ids
    assert (theirs.text, theirs.finish_reason) == (ours.text, ours.finish_reason)
    return False


@pytest.fixture(scope="session")
def same_greedy() -> Callable[..., bool]:
    """`assert_same_greedy`: two greedy outputs agree up to a near-tie."""
    return assert_same_greedy


def _stack_experts(state: dict, per_expert: bool) -> None:
    """Per-expert projections -> one [experts, out, in] tensor each, as llama.cpp's converters write them;
    with ``per_expert``, named per expert (``blk.N.ffn_gate.E``) as older llama.cpp Mixtral files are."""
    pattern = re.compile(
        r"model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight"
    )
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in list(state):
        match = pattern.fullmatch(name)
        if match:
            stacked = f"model.layers.{match[1]}.{match[2]}.experts.{match[4]}"
            groups.setdefault(stacked, []).append((int(match[3]), name))
    proj_names = {
        "gate_proj": "gate",
        "up_proj": "up",
        "down_proj": "down",
        "w1": "gate",
        "w3": "up",
        "w2": "down",
    }
    for stacked, members in groups.items():
        if per_expert:
            layer, proj = stacked.split(".")[2], proj_names[stacked.rsplit(".", 1)[1]]
            for e, name in members:
                state[f"blk.{layer}.ffn_{proj}.{e}.weight"] = state.pop(name)
        else:
            state[f"{stacked}.weight"] = np.stack([state.pop(name) for _, name in sorted(members)])


def _llama_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # convert_hf_to_gguf.LlamaModel.permute: rotate-half rows -> interleaved pairs.
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _add_family_metadata(writer, gguf_arch: str, config: dict, state: dict) -> None:
    """What llama.cpp's converter for ``gguf_arch`` adds beyond the shape (plus Mistral's window, which
    it drops; see docs/models.md)."""
    import gguf

    rope = config["rope_parameters"]
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_type") == "longrope":  # Phi3MiniModel
        original = config["original_max_position_embeddings"]
        scale = config["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        )
        writer.add_rope_scaling_orig_ctx_len(original)
        state["rope_factors_long.weight"] = np.array(rope["long_factor"], dtype=np.float32)
        state["rope_factors_short.weight"] = np.array(rope["short_factor"], dtype=np.float32)
    if config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])
    if gguf_arch == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if gguf_arch == "gemma3" and config["layer_types"][:2] == [
        "sliding_attention",
        "full_attention",
    ]:
        writer.add_sliding_window_pattern(2)  # llama.cpp assumes 6 when the key is absent
    if gguf_arch.startswith("gemma"):
        for name in state:
            if name.endswith("norm.weight"):
                state[name] = state[name] + 1  # Gemma converters store 1 + w
    if gguf_arch == "llama":
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        for name in state:
            if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
                state[name] = _llama_permute(state[name], heads if ".q_proj." in name else kv_heads)
    num_experts = config.get("num_experts") or config.get("num_local_experts")
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if config.get("moe_intermediate_size"):
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        if config.get("shared_expert_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def _add_tokenizer_metadata(writer, tokenizer_source: Path) -> None:
    """Copy the tokenizer metadata of the GGUF file ``tokenizer_source`` into ``writer``."""
    import gguf

    for key, value in gguf.GGUFReader(tokenizer_source).fields.items():
        if key.startswith("tokenizer."):
            sub_type = value.types[1] if len(value.types) > 1 else None
            writer.add_key_value(key, value.contents(), value.types[0], sub_type)


def _write_gguf(
    hf_dir: Path,
    gguf_arch: str,
    path: Path,
    tokenizer_source: Path,
    per_expert: bool = False,
    pooling_type: str | None = None,
) -> Path:
    """Write the float32 HF checkpoint in ``hf_dir`` as llama.cpp's converter would for ``gguf_arch``
    (its tensor names, q/k row order and norm offsets, experts stacked into 3-D tensors, its metadata
    keys), with the tokenizer metadata of the GGUF file ``tokenizer_source`` and, when given, a
    ``pooling_type`` (a name of gguf's ``PoolingType``, as embedding models' files carry)."""
    import json

    import gguf
    from safetensors.torch import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    state = {
        name: tensor.numpy() for name, tensor in load_file(hf_dir / "model.safetensors").items()
    }
    num_layers = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(path, gguf_arch)
    writer.add_block_count(num_layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if pooling_type is not None:
        writer.add_pooling_type(gguf.PoolingType[pooling_type])
    _add_family_metadata(writer, gguf_arch, config, state)
    _stack_experts(state, per_expert)
    _add_tokenizer_metadata(writer, tokenizer_source)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[gguf_arch.upper()], num_layers)
    for name, tensor in state.items():
        gguf_name = name if name.startswith(("blk.", "rope_factors")) else None
        writer.add_tensor(
            gguf_name or names.get_name(name, try_suffixes=(".weight", ".bias")), tensor
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def gguf_from_hf(default_model_path) -> Callable[[Path, str, Path], Path]:
    """``write(hf_dir, gguf_arch, path, per_expert=False, pooling_type=None)``: a GGUF file of a
    tiny HF checkpoint, written as llama.cpp's converter writes that architecture, with the default
    model's tokenizer."""
    return lambda hf_dir, gguf_arch, path, per_expert=False, pooling_type=None: _write_gguf(
        hf_dir, gguf_arch, path, default_model_path, per_expert, pooling_type
    )


# Per k-quant type: bytes of a 256-value super-block, and the byte offsets of its float16 scales
# with the value each gets (so that weights come out at about 0.02: the int scales go up to 63 or
# 127 and the values up to 15, 31, 63 or 7).
_K_QUANT_LAYOUTS = {
    "Q2_K": (84, {80: 1.5e-3, 82: 1e-3}),
    "Q3_K": (110, {108: 8e-4}),
    "Q4_K": (144, {0: 2e-4, 2: 1.5e-3}),
    "Q5_K": (176, {0: 1e-4, 2: 1.5e-3}),
    "Q6_K": (210, {208: 5e-5}),
}


def random_k_quant_blocks(rng, qtype, rows: int, k: int):
    """``rows`` rows of ``k`` values as random ``qtype`` (Q2_K .. Q6_K) blocks with weights of about 0.02."""
    block_bytes, scales = _K_QUANT_LAYOUTS[qtype.name]
    blocks = rng.integers(0, 256, (rows, k // 256, block_bytes), dtype=np.uint8)
    for offset, value in scales.items():
        blocks[..., offset : offset + 2] = np.full((rows, k // 256, 1), value, np.float16).view(
            np.uint8
        )
    return blocks.reshape(rows, -1)


@pytest.fixture(scope="session")
def k_quant_gguf(tmp_path_factory, default_model_path) -> Path:
    """A random 2-layer llama GGUF of width 256 as a Q4_K_M file holds it: Q4_K attention, gate and
    up matrices, Q6_K down matrices and embedding (tied), float32 norms; the default model's tokenizer."""
    import gguf

    q4_k, q6_k = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    hidden, heads, kv_heads, intermediate, layers = 256, 4, 2, 512, 2
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("k_quant") / "tiny-Q4_K_M.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(layers)
    writer.add_context_length(2048)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    _add_tokenizer_metadata(writer, default_model_path)
    vocab = len(gguf.GGUFReader(default_model_path).fields["tokenizer.ggml.tokens"].data)
    head_dim = hidden // heads

    def add(name, qtype, rows, k):
        writer.add_tensor(name, random_k_quant_blocks(rng, qtype, rows, k), raw_dtype=qtype)

    add("token_embd.weight", q6_k, vocab, hidden)
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        add(f"blk.{i}.attn_q.weight", q4_k, heads * head_dim, hidden)
        add(f"blk.{i}.attn_k.weight", q4_k, kv_heads * head_dim, hidden)
        add(f"blk.{i}.attn_v.weight", q4_k, kv_heads * head_dim, hidden)
        add(f"blk.{i}.attn_output.weight", q4_k, hidden, heads * head_dim)
        add(f"blk.{i}.ffn_gate.weight", q4_k, intermediate, hidden)
        add(f"blk.{i}.ffn_up.weight", q4_k, intermediate, hidden)
        add(f"blk.{i}.ffn_down.weight", q6_k, hidden, intermediate)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
