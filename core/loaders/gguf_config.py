"""Read a GGUF file's metadata into a ModelArchConfig, for the llama.cpp architectures that load.

llama.cpp keys each value by its architecture name (``qwen2.block_count``); ``_ARCHITECTURES`` maps
the names that load to ours. Mixture-of-experts layers are the ones holding a router
(``blk.N.ffn_gate_inp``); llama.cpp renormalises the chosen experts' weights for Qwen3-MoE only.
"""

from gguf import GGUFReader

from spyglass.core.models.model_config import ModelArchConfig

_MISSING = object()
# llama.cpp architecture -> ours. (Mistral and Mixtral files use "llama"; Gemma and Phi-3 files carry
# SentencePiece vocabularies, which the GGUF tokenizer reader does not build.)
_ARCHITECTURES = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe",
}


def field(reader: GGUFReader, key: str, default=_MISSING):
    """Metadata value ``key``; ValueError when it is missing and no ``default`` is given."""
    found = reader.get_field(key)
    if found is None:
        if default is _MISSING:
            raise ValueError(f"GGUF file lacks required metadata key {key!r}")
        return default
    return found.contents()


def read_arch(reader: GGUFReader) -> ModelArchConfig:
    """The architecture the file's metadata and tensor names describe; ValueError for what does not load."""
    name = field(reader, "general.architecture")
    if name not in _ARCHITECTURES:
        raise ValueError(f"GGUF architecture {name!r} is not supported; supported: {', '.join(_ARCHITECTURES)}.")
    tensor_names = {tensor.name for tensor in reader.tensors}

    def get(key: str, default=_MISSING):
        return field(reader, f"{name}.{key}", default)

    hidden, heads, num_layers = get("embedding_length"), get("attention.head_count"), get("block_count")
    eos = field(reader, "tokenizer.ggml.eos_token_id", None)
    # End-of-turn ends generation in llama.cpp too (e.g. Llama 3's <|eot_id|> when eos is <|end_of_text|>).
    eot = field(reader, "tokenizer.ggml.eot_token_id", None)
    moe_layers = tuple(i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" in tensor_names)
    return ModelArchConfig(
        architecture=_ARCHITECTURES[name],
        vocab_size=get("vocab_size", None) or len(field(reader, "tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length", 0),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        head_dim=get("attention.key_length", hidden // heads),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon"),
        rope_theta=get("rope.freq_base", 10000.0),
        max_position_embeddings=get("context_length"),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        rope_scaling=_rope_scaling(reader, name, tensor_names),
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_ids=tuple(dict.fromkeys(i for i in (eos, eot) if i is not None)),
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        num_experts=get("expert_count", 0),
        num_experts_per_tok=get("expert_used_count", 0),
        moe_intermediate_size=get("expert_feed_forward_length", 0),
        shared_expert_intermediate_size=get("expert_shared_feed_forward_length", 0),
        norm_topk_prob=get("expert_weights_norm", name == "qwen3moe"),
        moe_layers=moe_layers,
    )


def _rope_scaling(reader: GGUFReader, name: str, tensor_names: set[str]) -> dict | None:
    scaling = field(reader, f"{name}.rope.scaling.type", "none")
    if scaling == "yarn":
        return {
            "rope_type": "yarn",
            "factor": field(reader, f"{name}.rope.scaling.factor"),
            "original_max_position_embeddings": field(reader, f"{name}.rope.scaling.original_context_length"),
        }
    if scaling != "none" or "rope_freqs.weight" in tensor_names:
        # llama.cpp bakes Llama 3.1 scaling into a rope_freqs tensor and drops the parameters that
        # produced it; guessing them back would silently give wrong logits at long range.
        raise ValueError(
            f"GGUF files with {scaling!r} RoPE scaling are not supported; load the Hugging Face directory instead."
        )
    return None
