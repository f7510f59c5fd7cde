"""Which model class serves which architecture: the one seam between the engine and the model families.

The engine, runner, KV cache, scheduler and telemetry see only `CausalLM`; a new family adds a class
with that interface, a `weight_names` function, and a `ModelFamily` row here.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch

from spyglass.core.models import gemma, llama
from spyglass.core.models.attention_metadata import AttentionMetadata
from spyglass.core.models.clip_vision import vision_weight_names
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.pixtral_vision import pixtral_weight_names
from spyglass.core.models.qwen_vision import qwen_vision_weight_names
from spyglass.core.models.vision_language import vision_language_model
from spyglass.kernels.backend import AttentionBackend


class CausalLM(Protocol):
    """What the runner needs from a model: its config, kernels and dtype, and a forward to logits,
    also in two halves (CUDA graphs capture the first and run the second on the sampled rows only),
    and the final norm's output that the head reads (embedding requests' vectors). A sequence
    classifier (``arch.num_labels`` > 0; Llama-style families) also has ``classify``."""

    arch: ModelArchConfig
    backend: AttentionBackend

    @property
    def dtype(self) -> torch.dtype: ...

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor: ...

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def logits(
        self, hidden: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor | slice
    ) -> torch.Tensor: ...

    def final_hidden(
        self, hidden: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor | slice
    ) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """One architecture: the HF class it loads from, the model class that runs it, the parameter names
    its checkpoints hold, and the HF config class defaults for keys a config.json may omit."""

    architecture: str
    hf_class: str
    model_class: type
    weight_names: Callable[[ModelArchConfig], set[str]]
    config_defaults: dict = field(default_factory=dict)
    qk_norm: bool = False


_GEMMA_DEFAULTS = {
    "hidden_act": "gelu_pytorch_tanh",
    "sliding_window": 4096,
    "query_pre_attn_scalar": 256,
}
FAMILIES = (
    ModelFamily(
        "llama",
        "LlamaForCausalLM",
        llama.LlamaForCausalLM,
        llama.weight_names,
        {"max_position_embeddings": 2048},
    ),
    ModelFamily(
        "qwen2",
        "Qwen2ForCausalLM",
        llama.LlamaForCausalLM,
        llama.weight_names,
        {"max_position_embeddings": 32768, "attention_bias": True},
    ),
    ModelFamily(
        "qwen3",
        "Qwen3ForCausalLM",
        llama.LlamaForCausalLM,
        llama.weight_names,
        {"max_position_embeddings": 32768},
        qk_norm=True,
    ),
    ModelFamily(
        "mistral",
        "MistralForCausalLM",
        llama.LlamaForCausalLM,
        llama.weight_names,
        {"max_position_embeddings": 131072, "sliding_window": 4096},
    ),
    ModelFamily(
        "phi3",
        "Phi3ForCausalLM",
        llama.LlamaForCausalLM,
        partial(llama.weight_names, fused_projections=True),
        {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5},
    ),
    ModelFamily(
        "gemma2",
        "Gemma2ForCausalLM",
        gemma.GemmaForCausalLM,
        gemma.weight_names,
        {
            **_GEMMA_DEFAULTS,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": True,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
        },
    ),
    ModelFamily(
        "gemma3",
        "Gemma3ForCausalLM",
        gemma.GemmaForCausalLM,
        gemma.weight_names,
        {
            **_GEMMA_DEFAULTS,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
        },
        qk_norm=True,
    ),
    ModelFamily(
        "mixtral",
        "MixtralForCausalLM",
        llama.LlamaForCausalLM,
        llama.weight_names,
        {"max_position_embeddings": 131072, "rope_theta": 1000000.0, "norm_topk_prob": True},
    ),
    ModelFamily(
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        llama.LlamaForCausalLM,
        llama.weight_names,
        {"max_position_embeddings": 32768, "attention_bias": True},
    ),
    ModelFamily(
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        llama.LlamaForCausalLM,
        llama.weight_names,
        {"max_position_embeddings": 32768},
        qk_norm=True,
    ),
)
_BY_HF_CLASS = {family.hf_class: family for family in FAMILIES}
# The Llama-style families' base models (no head, as embedding models ship: e5-mistral's
# MistralModel, gte-Qwen2's Qwen2Model, ...) and sequence classifiers (reward models, ...).
_LLAMA_STYLE = [family for family in FAMILIES if family.model_class is llama.LlamaForCausalLM]
_BY_BASE_CLASS = {f.hf_class.removesuffix("ForCausalLM") + "Model": f for f in _LLAMA_STYLE}
_BY_CLASSIFIER_CLASS = {
    f.hf_class.removesuffix("ForCausalLM") + "ForSequenceClassification": f for f in _LLAMA_STYLE
}
_BY_ARCHITECTURE = {family.architecture: family for family in FAMILIES}


def supported_hf_classes() -> str:
    """The HF model classes that load, comma-separated, for error messages and docs."""
    return (
        f"{', '.join(_BY_HF_CLASS)}; for embeddings, {', '.join(_BY_BASE_CLASS)}; "
        f"for classification, {', '.join(_BY_CLASSIFIER_CLASS)}"
    )


def model_head(class_name: str | None) -> str:
    """The head of a supported HF class: ``"lm"`` (a causal LM), ``"none"`` (a base model, which
    serves embeddings only) or ``"classifier"`` (a sequence classifier)."""
    if class_name in _BY_BASE_CLASS:
        return "none"
    return "classifier" if class_name in _BY_CLASSIFIER_CLASS else "lm"


def family_for_hf_class(class_name: str | None) -> ModelFamily:
    """The family of HF class ``class_name`` (a causal LM, its base model or its sequence
    classifier); ValueError naming every supported class otherwise."""
    family = (
        _BY_HF_CLASS.get(class_name)
        or _BY_BASE_CLASS.get(class_name)
        or _BY_CLASSIFIER_CLASS.get(class_name)
    )
    if family is None:
        raise ValueError(
            f"Unsupported model class {class_name!r}; supported: {supported_hf_classes()}."
        )
    return family


def family(architecture: str) -> ModelFamily:
    """The family of ``architecture`` (a `ModelArchConfig.architecture`)."""
    if architecture not in _BY_ARCHITECTURE:
        raise ValueError(
            f"Unsupported architecture {architecture!r}; supported: {', '.join(_BY_ARCHITECTURE)}."
        )
    return _BY_ARCHITECTURE[architecture]


def model_weight_names(arch: ModelArchConfig) -> set[str]:
    """The parameter names a checkpoint of ``arch`` holds: its family's, and a vision model's
    tower and projector."""
    names = family(arch.architecture).weight_names(arch)
    if arch.vision is None:
        return names
    if arch.vision.temporal_patch_size:
        return names | qwen_vision_weight_names(arch.vision)
    if arch.vision.tower == "pixtral":
        return names | pixtral_weight_names(arch.vision)
    return names | vision_weight_names(arch.vision)


def build_model(
    arch: ModelArchConfig, weights: dict[str, torch.Tensor], backend: AttentionBackend, device
) -> CausalLM:
    """The model for ``arch`` over ``weights`` (HF names), on ``device``, running ``backend``'s
    kernels: with its vision tower when ``arch.vision`` is set."""
    model_class = family(arch.architecture).model_class
    if arch.vision is not None:
        model_class = vision_language_model(model_class)
    return model_class(arch, weights, backend, device)
