"""Read a Gemma 3 vision model's config (``Gemma3ForConditionalGeneration``): its language model's
as a ``Gemma3ForCausalLM`` config.json, the `VisionConfig` of its SigLIP tower, projector, image
processor and image tokens; its checkpoint's parameter names are LLaVA's (`llava_config`)."""

from spyglass.core.loaders.image_processor_config import image_processor_config, pixel_scaling
from spyglass.core.loaders.llava_config import check_steps_on
from spyglass.core.models.vision_config import VisionConfig
from spyglass.core.tokenizer import Tokenizer

GEMMA3_VISION_CLASS = "Gemma3ForConditionalGeneration"

# Gemma3TextConfig's defaults the Gemma 3 family's do not hold, for keys a config leaves out.
_TEXT_DEFAULTS = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
}
# SiglipVisionConfig's defaults.
_TOWER_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "vision_use_head": True,
}
# Gemma3ImageProcessor's defaults.
_PROCESSOR_DEFAULTS = {
    "resample": 2,  # bilinear
    "rescale_factor": 1 / 255,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
# Tokens the tokenizer reads as one that an image's "\n\n" may meet: vLLM's merges for Gemma 3.
_NEWLINE_MERGES = (("\n", "\n\n", "\n\n\n"), ("\n\n", "\n", "\n\n\n"), ("\n\n", "\n\n", "\n\n\n\n"))


def is_gemma3_vision(config: dict) -> bool:
    """Whether ``config`` (a config.json) is a Gemma 3 vision model's."""
    return (config.get("architectures") or [None])[0] == GEMMA3_VISION_CLASS


def text_config(config: dict) -> dict:
    """The language model's config as a ``Gemma3ForCausalLM`` config.json (tying is the outer
    config's say, as in transformers)."""
    text = {**_TEXT_DEFAULTS, **(config.get("text_config") or {})}
    text["tie_word_embeddings"] = config.get("tie_word_embeddings", True)
    return {**text, "architectures": ["Gemma3ForCausalLM"]}


def vision_config(config: dict, model_dir, tokenizer: Tokenizer) -> VisionConfig:
    """The tower, projector and image processor of ``config`` and ``model_dir``, and the image's
    tokens from ``tokenizer``; ValueError for what does not run here."""
    tower = {**_TOWER_DEFAULTS, **(config.get("vision_config") or {})}
    if tower.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise ValueError(
            f"Unsupported {GEMMA3_VISION_CLASS} variant: a {tower['model_type']!r} tower."
        )
    side = tower["image_size"] // tower["patch_size"]
    tokens = config.get("mm_tokens_per_image", 256)
    per_side = round(tokens**0.5)
    if per_side**2 != tokens or side % per_side:
        raise ValueError(
            f"mm_tokens_per_image {tokens} is no square grid that pools the tower's {side} x "
            f"{side} patches evenly."
        )
    processor = {**_PROCESSOR_DEFAULTS, **image_processor_config(model_dir)}
    check_steps_on(processor)
    size = processor.get("size") or {}
    if any(
        size.get(side_name, tower["image_size"]) != tower["image_size"]
        for side_name in ("height", "width")
    ):
        raise ValueError(
            f"the image processor resizes images to {size}; the vision tower takes "
            f"{tower['image_size']} x {tower['image_size']}."
        )
    if processor.get("do_pan_and_scan"):
        raise ValueError(
            "the image processor pans and scans (do_pan_and_scan), which does not run here."
        )
    newlines = tuple(tokenizer.encode("\n\n", add_special_tokens=False))
    boi = config.get("boi_token_index", 255999)
    eoi = config.get("eoi_token_index", 256000)
    return VisionConfig(
        hidden_size=tower["hidden_size"],
        intermediate_size=tower["intermediate_size"],
        num_hidden_layers=tower["num_hidden_layers"],
        num_attention_heads=tower["num_attention_heads"],
        image_size=tower["image_size"],
        patch_size=tower["patch_size"],
        image_token_id=config.get("image_token_id", config.get("image_token_index", 262144)),
        tower="gemma3",
        use_head=tower["vision_use_head"],
        num_channels=tower["num_channels"],
        layer_norm_eps=tower["layer_norm_eps"],
        hidden_act=tower["hidden_act"],
        feature_layer=-1,
        feature_select="full",
        center_crop=False,
        **pixel_scaling(processor),
        scale_factor=side // per_side,
        placeholder_token_id=boi,
        image_prefix_ids=(*newlines, boi),
        image_suffix_ids=(eoi, *newlines),
        token_merges=_newline_merges(tokenizer),
        bidirectional=True,
    )


def _newline_merges(tokenizer: Tokenizer) -> tuple[tuple[int, int, int], ...]:
    """``(a, b, ab)`` for each of `_NEWLINE_MERGES` whose three texts are one token each."""

    def single(text: str) -> int | None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    merges = []
    for texts in _NEWLINE_MERGES:
        ids = [single(text) for text in texts]
        if None not in ids:
            merges.append(tuple(ids))
    return tuple(merges)
