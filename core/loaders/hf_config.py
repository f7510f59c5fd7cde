"""Read a Hugging Face config.json into a ModelArchConfig, for every family in `core.models.registry`.

Accepts both the transformers 4 spellings (``rope_theta``/``rope_scaling``, ``rope_local_base_freq``)
and the transformers 5 ones (``rope_parameters``, per layer type for Gemma 3).
"""

from spyglass.core.models.layers import gated_activation
from spyglass.core.models.model_config import FULL, SLIDING, ModelArchConfig
from spyglass.core.models.registry import ModelFamily, family_for_hf_class, model_head
from spyglass.core.models.rope import SCALING_TYPES


def hf_family(config: dict) -> ModelFamily:
    """The family of the model class ``config`` names; ValueError listing the supported classes otherwise."""
    return family_for_hf_class((config.get("architectures") or [None])[0])


def read_arch(config: dict, eos_token_ids: tuple[int, ...]) -> ModelArchConfig:
    """The architecture ``config`` describes; ValueError for classes and variants that do not load."""
    family = hf_family(config)
    defaults = family.config_defaults
    head = model_head((config.get("architectures") or [None])[0])
    labels = _labels(config) if head == "classifier" else ()

    def get(key: str, default=None):
        return config[key] if config.get(key) is not None else defaults.get(key, default)

    hidden_act = config.get("hidden_activation") or get("hidden_act", "silu")
    gated_activation(hidden_act)  # raises for an activation no backend has
    if config.get("mlp_bias"):
        raise ValueError(f"Unsupported {family.hf_class} variant: MLP biases.")
    rope_theta, rope_scaling, local_rope_theta = _read_rope(config, get)
    hidden, heads, num_layers = (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_hidden_layers"],
    )
    sliding_window = (
        None if config.get("use_sliding_window") is False else (get("sliding_window") or None)
    )
    num_experts = config.get("num_local_experts") or config.get("num_experts") or 0
    sparse_step, dense_layers = (
        config.get("decoder_sparse_step") or 1,
        set(config.get("mlp_only_layers") or ()),
    )
    return ModelArchConfig(
        architecture=family.architecture,
        has_lm_head=head == "lm",
        num_labels=len(labels),
        labels=labels,
        matryoshka_dimensions=_matryoshka_dimensions(config),
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        rms_norm_eps=get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=get("tie_word_embeddings", False),
        # Qwen2-MoE spells it qkv_bias.
        attention_bias=bool(
            config.get("attention_bias", config.get("qkv_bias", defaults.get("attention_bias")))
        ),
        rope_scaling=rope_scaling,
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_token_ids,
        hidden_act=hidden_act,
        sliding_window=sliding_window,
        layer_types=_layer_types(config, family.architecture, num_layers) if sliding_window else (),
        qk_norm=family.qk_norm,
        query_pre_attn_scalar=get("query_pre_attn_scalar"),
        attn_logit_softcapping=get("attn_logit_softcapping"),
        final_logit_softcapping=get("final_logit_softcapping"),
        local_rope_theta=local_rope_theta,
        num_experts=num_experts,
        num_experts_per_tok=config.get("num_experts_per_tok") or 0,
        # Mixtral's experts are intermediate_size wide; the Qwen MoE families name their width separately.
        moe_intermediate_size=config.get("moe_intermediate_size")
        or (num_experts and config["intermediate_size"]),
        shared_expert_intermediate_size=config.get("shared_expert_intermediate_size") or 0,
        norm_topk_prob=bool(get("norm_topk_prob", False)),
        moe_layers=tuple(
            i
            for i in range(num_layers)
            if num_experts and i not in dense_layers and (i + 1) % sparse_step == 0
        ),
    )


def _read_rope(config: dict, get) -> tuple[float, dict | None, float | None]:
    """``(rope_theta, rope_scaling or None, the sliding layers' own rope base or None)``."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    local_theta = get("rope_local_base_freq")
    if FULL in rope:  # transformers 5 Gemma 3: one parameter set per layer type
        local_theta = rope.get(SLIDING, {}).get("rope_theta", local_theta)
        rope = dict(rope[FULL])
    theta = rope.pop("rope_theta", get("rope_theta", 10000.0))
    partial = rope.pop("partial_rotary_factor", None) or config.get("partial_rotary_factor")
    if partial not in (None, 1.0):
        raise ValueError(
            "Unsupported rope variant: partial rotary embeddings (partial_rotary_factor < 1)."
        )
    # Older configs call the key "type"; "default" means no scaling at all.
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if "mrope_section" in rope:  # Qwen2-VL's (and Qwen3-VL's interleaved) M-RoPE
        rope_type = "mrope"
    if rope_type == "default":
        return theta, None, local_theta
    if rope_type not in SCALING_TYPES:
        raise ValueError(
            f"unsupported rope scaling {rope_type!r}; supported: {', '.join(SCALING_TYPES)}"
        )
    if rope_type in ("longrope", "yarn") and config.get("original_max_position_embeddings"):
        # Phi-3 keeps the pretraining length beside the rope parameters; transformers moves it inside.
        rope["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    return theta, {"rope_type": rope_type, **rope}, local_theta


def _layer_types(config: dict, architecture: str, num_layers: int) -> tuple[str, ...]:
    """Which layers slide: as config.json lists them, else as the family's HF config class derives them."""
    if config.get("layer_types"):
        return tuple(config["layer_types"])
    if architecture == "gemma2":
        return tuple(SLIDING if (i + 1) % 2 else FULL for i in range(num_layers))
    if architecture == "gemma3":
        pattern = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6
        return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))
    if architecture.startswith("qwen"):
        first_sliding = config.get("max_window_layers", num_layers)
        return tuple(SLIDING if i >= first_sliding else FULL for i in range(num_layers))
    return ()  # Mistral, Mixtral, Phi-3: every layer slides


def _labels(config: dict) -> tuple[str, ...]:
    """A sequence classifier's class names in order: ``id2label``'s, else ``LABEL_i`` for each of
    ``num_labels`` (transformers' default: 2)."""
    id2label = config.get("id2label") or {}
    if id2label:
        return tuple(id2label[key] for key in sorted(id2label, key=int))
    return tuple(f"LABEL_{i}" for i in range(config.get("num_labels") or 2))


def _matryoshka_dimensions(config: dict) -> tuple[int, ...]:
    """The embedding lengths a Matryoshka-trained model may be cut to, as vLLM reads its config:
    ``matryoshka_dimensions`` listed, ``(0,)`` (any) for ``is_matryoshka``, else none."""
    listed = config.get("matryoshka_dimensions")
    if listed:
        return tuple(int(d) for d in listed)
    return (0,) if config.get("is_matryoshka") else ()
