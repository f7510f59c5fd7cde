"""Read a GGUF file's metadata into a ModelArchConfig, for the llama.cpp architectures that load.

llama.cpp keys each value by its architecture name (``qwen2.block_count``); ``_ARCHITECTURES`` maps
the names that load to ours. Mixture-of-experts layers are the ones holding a router
(``blk.N.ffn_gate_inp``). What llama.cpp hard-codes per architecture rather than storing (Gemma's
activation, sliding-window pattern, local rope base and query scale; whether the chosen experts'
weights are renormalised) is filled in here the way llama.cpp fills it in.
"""

import math

from gguf import GGUFReader

from spyglass.core.models.model_config import FULL, SLIDING, ModelArchConfig

_MISSING = object()
# llama.cpp architecture -> ours. Mistral and Mixtral files use "llama": one with experts reads as
# "mixtral", one with a sliding window as "mistral" (the same model class as "llama" either way).
_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
}
# llama.cpp renormalises the chosen experts' weights for these (its llama graph does for Mixtral).
_NORM_TOPK = {"llama", "qwen3moe"}
# Gemma: every n-th layer is global (llama.cpp's set_swa_pattern); the 27B models, recognised by their
# depth, scale queries by hidden / heads instead of head_dim (llama.cpp's f_attention_scale).
_GEMMA_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def field(reader: GGUFReader, key: str, default=_MISSING):
    """Metadata value ``key``; ValueError when it is missing and no ``default`` is given."""
    found = reader.get_field(key)
    if found is None:
        if default is _MISSING:
            raise ValueError(f"GGUF file lacks required metadata key {key!r}")
        return default
    return found.contents()


def gguf_architecture(reader: GGUFReader) -> str:
    """llama.cpp's name for the file's architecture; ValueError for one that does not load."""
    name = field(reader, "general.architecture")
    if name not in _ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {name!r} is not supported; supported: {', '.join(_ARCHITECTURES)}."
        )
    return name


def read_arch(reader: GGUFReader) -> ModelArchConfig:
    """The architecture the file's metadata and tensor names describe; ValueError for what does not load."""
    name = gguf_architecture(reader)
    tensor_names = {tensor.name for tensor in reader.tensors}

    def get(key: str, default=_MISSING):
        return field(reader, f"{name}.{key}", default)

    hidden, heads, num_layers = (
        get("embedding_length"),
        get("attention.head_count"),
        get("block_count"),
    )
    head_dim = get("attention.key_length", hidden // heads)
    eos = field(reader, "tokenizer.ggml.eos_token_id", None)
    # End-of-turn ends generation in llama.cpp too (e.g. Llama 3's <|eot_id|> when eos is <|end_of_text|>).
    eot = field(reader, "tokenizer.ggml.eot_token_id", None)
    num_experts = get("expert_count", 0)
    moe_layers = tuple(
        i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" in tensor_names
    )
    sliding_window = get("attention.sliding_window", 0) or None
    architecture = _ARCHITECTURES[name]
    if name == "llama":
        architecture = "mixtral" if num_experts else "mistral" if sliding_window else "llama"
    gemma = name in _GEMMA_SWA_PATTERN
    return ModelArchConfig(
        architecture=architecture,
        vocab_size=get("vocab_size", None) or len(field(reader, "tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length", 0),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=get("attention.layer_norm_rms_epsilon"),
        rope_theta=get("rope.freq_base", 10000.0),
        max_position_embeddings=get("context_length"),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        rope_scaling=_rope_scaling(reader, name, tensor_names),
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_ids=tuple(dict.fromkeys(i for i in (eos, eot) if i is not None)),
        hidden_act="gelu_pytorch_tanh" if gemma else "silu",
        sliding_window=sliding_window,
        layer_types=_gemma_layer_types(reader, name, num_layers)
        if gemma and sliding_window
        else (),
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        query_pre_attn_scalar=_query_pre_attn_scalar(reader, name, hidden // heads, head_dim)
        if gemma
        else None,
        attn_logit_softcapping=get("attn_logit_softcapping", None),
        final_logit_softcapping=get("final_logit_softcapping", None),
        # llama.cpp's Gemma 3 rotates sliding layers with base 10000 unless the file says otherwise.
        local_rope_theta=get("rope.freq_base_swa", 10000.0) if name == "gemma3" else None,
        num_experts=num_experts,
        num_experts_per_tok=get("expert_used_count", 0),
        # Mixtral's experts are feed_forward_length wide; the Qwen MoE files name their width separately.
        moe_intermediate_size=get("expert_feed_forward_length", 0)
        or (num_experts and get("feed_forward_length", 0)),
        shared_expert_intermediate_size=get("expert_shared_feed_forward_length", 0),
        norm_topk_prob=bool(get("expert_weights_norm", name in _NORM_TOPK))
        if num_experts
        else False,
        moe_layers=moe_layers,
        # llama.cpp's enum: 0 none (token embeddings), 1 mean, 2 cls, 3 last, 4 rank.
        pooling_type={0: "last", 1: "mean", 2: "cls", 3: "last"}.get(
            get("pooling_type", 0), "rank"
        ),
    )


def _gemma_layer_types(reader: GGUFReader, name: str, num_layers: int) -> tuple[str, ...]:
    # The pattern key is either n (every n-th layer global) or one flag per layer (True: sliding).
    pattern = field(reader, f"{name}.attention.sliding_window_pattern", _GEMMA_SWA_PATTERN[name])
    if isinstance(pattern, list):
        return tuple(SLIDING if sliding else FULL for sliding in pattern)
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))


def _query_pre_attn_scalar(
    reader: GGUFReader, name: str, hidden_per_head: int, head_dim: int
) -> float:
    scale = field(reader, f"{name}.attention.scale", None)
    if scale is not None:
        return 1.0 / scale**2
    if field(reader, f"{name}.block_count") == _GEMMA_27B_LAYERS[name]:
        return hidden_per_head
    return head_dim


def _rope_scaling(reader: GGUFReader, name: str, tensor_names: set[str]) -> dict | None:
    scaling = field(reader, f"{name}.rope.scaling.type", "none")
    if "rope_factors_long.weight" in tensor_names:
        return _longrope(reader, name)
    if scaling == "yarn":
        return {
            "rope_type": "yarn",
            "factor": field(reader, f"{name}.rope.scaling.factor"),
            "original_max_position_embeddings": field(
                reader, f"{name}.rope.scaling.original_context_length"
            ),
        }
    if scaling == "linear":
        return {"rope_type": "linear", "factor": field(reader, f"{name}.rope.scaling.factor")}
    if scaling != "none" or "rope_freqs.weight" in tensor_names:
        # llama.cpp bakes Llama 3.1 scaling into a rope_freqs tensor and drops the parameters that
        # produced it; guessing them back would silently give wrong logits at long range.
        raise ValueError(
            f"GGUF files with {scaling!r} RoPE scaling are not supported; load the Hugging Face directory instead."
        )
    return None


def _longrope(reader: GGUFReader, name: str) -> dict:
    """Phi-3's LongRoPE: the factors are tensors, the pretraining length and attention factor metadata."""
    factors = {
        t.name: [float(f) for f in t.data]
        for t in reader.tensors
        if t.name.startswith("rope_factors")
    }
    original = field(reader, f"{name}.rope.scaling.original_context_length")
    scaling = {
        "rope_type": "longrope",
        "short_factor": factors["rope_factors_short.weight"],
        "long_factor": factors["rope_factors_long.weight"],
        "original_max_position_embeddings": original,
    }
    # llama.cpp's converter stores the factor transformers derives from the two lengths; keep it only
    # where it says something else (float32 storage moves it by ~1e-7).
    factor = field(reader, f"{name}.context_length") / original
    derived = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    stored = field(reader, f"{name}.rope.scaling.attn_factor", derived)
    if abs(stored - derived) > 1e-6:
        scaling["attention_factor"] = stored
    return scaling
