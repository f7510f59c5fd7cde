"""Read a Mistral 3 vision model's config (``Mistral3ForConditionalGeneration``: Mistral Small
3.1 and 3.2, Ministral 3): its language model's as a Llama-style causal LM's config.json, the
`VisionConfig` of its Pixtral tower, projector, image processor and image tokens; its
checkpoint's parameter names are LLaVA's (`llava_config`)."""

from pathlib import Path

from spyglass.core.loaders.image_processor_config import image_processor_config, pixel_scaling
from spyglass.core.loaders.llava_config import check_steps_on
from spyglass.core.models.registry import FAMILIES
from spyglass.core.models.vision_config import VisionConfig
from spyglass.core.tokenizer import Tokenizer

MISTRAL3_CLASS = "Mistral3ForConditionalGeneration"

# PixtralVisionConfig's defaults.
_TOWER_DEFAULTS = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_channels": 3,
    "patch_size": 16,
    "hidden_act": "gelu",
}
# PixtralImageProcessor's defaults.
_PROCESSOR_DEFAULTS = {
    "size": {"longest_edge": 1024},
    "resample": 3,  # bicubic
    "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
ROW_BREAK = "[IMG_BREAK]"
IMAGE_END = "[IMG_END]"


def is_mistral3(config: dict) -> bool:
    """Whether ``config`` (a config.json) is a Mistral 3 vision model's."""
    return (config.get("architectures") or [None])[0] == MISTRAL3_CLASS


def text_config(config: dict) -> dict:
    """The language model's config, naming its family's causal LM class (tying is the outer
    config's say where it has one, as for LLaVA); ValueError for a family other than the
    Llama-style ones."""
    text = dict(config.get("text_config") or {})
    model_type = text.get("model_type", "mistral")
    family = next((f for f in FAMILIES if f.architecture == model_type), None)
    if family is None or family.model_class.__name__ != "LlamaForCausalLM":
        raise ValueError(f"Unsupported {MISTRAL3_CLASS} variant: a {model_type!r} language model.")
    if "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return {**text, "architectures": [family.hf_class]}


def vision_config(config: dict, model_dir: Path, tokenizer: Tokenizer) -> VisionConfig:
    """The tower, projector and image processor of ``config`` and ``model_dir``, and the image's
    tokens from ``tokenizer``; ValueError for what does not run here."""
    tower = {**_TOWER_DEFAULTS, **(config.get("vision_config") or {})}
    if tower.get("model_type", "pixtral") != "pixtral":
        raise ValueError(f"Unsupported {MISTRAL3_CLASS} variant: a {tower['model_type']!r} tower.")
    layer = config.get("vision_feature_layer", -1)
    if layer not in (-1, tower["num_hidden_layers"]):
        raise ValueError(
            f"vision_feature_layer {layer!r}: only the tower's last layer's output is read here."
        )
    width, heads = tower["hidden_size"], tower["num_attention_heads"]
    if tower.get("head_dim", width // heads) != width // heads:
        raise ValueError(f"the tower's head_dim {tower['head_dim']} is not its width / heads.")
    processor = {**_PROCESSOR_DEFAULTS, **image_processor_config(model_dir)}
    check_steps_on(processor)
    longest = (processor.get("size") or {}).get("longest_edge")
    if not longest:
        raise ValueError("the image processor's size has no longest_edge.")
    text = text_config(config)
    return VisionConfig(
        hidden_size=width,
        intermediate_size=tower["intermediate_size"],
        num_hidden_layers=tower["num_hidden_layers"],
        num_attention_heads=heads,
        image_size=longest,
        patch_size=tower["patch_size"],
        image_token_id=config.get("image_token_id", config.get("image_token_index", 10)),
        tower="pixtral",
        num_channels=tower["num_channels"],
        layer_norm_eps=1e-5,
        hidden_act=tower["hidden_act"],
        feature_layer=-1,
        feature_select="full",
        projector_act=config.get("projector_hidden_act", "gelu"),
        projector_bias=config.get("multimodal_projector_bias", False),
        center_crop=False,
        **pixel_scaling(processor),
        scale_factor=config.get("spatial_merge_size", 2),
        rope_theta=(tower.get("rope_parameters") or {}).get(
            "rope_theta", tower.get("rope_theta", 10000.0)
        ),
        projector_norm_eps=text.get("rms_norm_eps", 1e-5),
        row_break_token_id=_token_id(tokenizer, ROW_BREAK),
        image_end_token_id=_token_id(tokenizer, IMAGE_END),
    )


def _token_id(tokenizer: Tokenizer, name: str) -> int:
    found = tokenizer.backend.token_to_id(name)
    if found is None:
        raise ValueError(
            f"the tokenizer has no {name} token, which Mistral 3 prompts put in images"
        )
    return found
