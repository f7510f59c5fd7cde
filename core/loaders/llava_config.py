"""Read a ``LlavaForConditionalGeneration``, ``LlavaNextForConditionalGeneration`` or
``LlavaOnevisionForConditionalGeneration`` directory's config: its language model's config as a
causal LM of a supported family would have it, and the `VisionConfig` of its CLIP or SigLIP
tower, projector, grid resolutions and image preprocessing (``preprocessor_config.json``); and its
checkpoint's parameter names mapped to the ones the models use."""

import json
from pathlib import Path

from spyglass.core.models.registry import FAMILIES
from spyglass.core.models.vision_config import FEATURE_SELECTS, VisionConfig

LLAVA_CLASS = "LlavaForConditionalGeneration"
LLAVA_NEXT_CLASS = "LlavaNextForConditionalGeneration"
LLAVA_ONEVISION_CLASS = "LlavaOnevisionForConditionalGeneration"
# The config classes' default grid resolutions, (height, width): LLaVA-NeXT's, and
# LLaVA-OneVision's (every grid of 1 to 6 by 1 to 6 tiles of 384).
_PINPOINTS = {
    LLAVA_NEXT_CLASS: ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)),
    LLAVA_ONEVISION_CLASS: tuple((384 * r, 384 * c) for r in range(1, 7) for c in range(1, 7)),
}

# The HF config classes' defaults for keys llava-hf's config.json leaves out (llava-1.5's
# text_config names only the vocabulary and context; its vision_config only what differs).
LLAMA_DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
}
_CLIP_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 32,
    "num_channels": 3,
    "layer_norm_eps": 1e-5,
    "hidden_act": "quick_gelu",
}
_SIGLIP_DEFAULTS = {
    **_CLIP_DEFAULTS,
    "patch_size": 16,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
}
_TOWER_DEFAULTS = {"clip_vision_model": _CLIP_DEFAULTS, "siglip_vision_model": _SIGLIP_DEFAULTS}
# Checkpoint prefixes, as llava-hf's files (transformers 4) and transformers 5 write them.
# Applied in order, each where it matches.
_RENAMES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("model.image_newline", "image_newline"),
)


def is_llava(config: dict) -> bool:
    """Whether ``config`` (a config.json) is a LLaVA or LLaVA-NeXT model's."""
    architecture = (config.get("architectures") or [None])[0]
    return architecture in (LLAVA_CLASS, LLAVA_NEXT_CLASS, LLAVA_ONEVISION_CLASS)


def text_config(config: dict) -> dict:
    """The language model's config, naming the causal LM class of its family; ValueError for a
    family other than the Llama-style ones. Whether the output is tied to the embedding is the
    outer config's say where it has one, as in transformers (a LLaVA-NeXT's text_config may say
    tied while the model is not)."""
    text = dict(config.get("text_config") or {})
    model_type = text.get("model_type", "llama")
    family = next((f for f in FAMILIES if f.architecture == model_type), None)
    if family is None or family.model_class.__name__ != "LlamaForCausalLM":
        raise ValueError(f"Unsupported {LLAVA_CLASS} variant: a {model_type!r} language model.")
    defaults = LLAMA_DEFAULTS if model_type == "llama" else {}
    if "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return {**defaults, **text, "architectures": [family.hf_class]}


def vision_config(config: dict, model_dir: Path) -> VisionConfig:
    """The vision side of ``config`` and of ``model_dir``'s preprocessor_config.json (CLIP's
    defaults at the tower's image size when it has none); ValueError for what does not run here."""
    architecture = config["architectures"][0]
    # The config classes' defaults: LLaVA(-NeXT)'s CLIP read at its second to last layer,
    # without the class token; OneVision's SigLIP at its last, every patch.
    onevision = architecture == LLAVA_ONEVISION_CLASS
    given = config.get("vision_config") or {}
    model_type = given.get(
        "model_type", "siglip_vision_model" if onevision else "clip_vision_model"
    )
    if model_type not in _TOWER_DEFAULTS:
        raise ValueError(
            f"Unsupported {architecture} variant: a {model_type!r} vision tower "
            "(CLIP's and SigLIP's run here)."
        )
    vision = {**_TOWER_DEFAULTS[model_type], **given}
    feature_layer = config.get("vision_feature_layer", -1 if onevision else -2)
    feature_select = config.get(
        "vision_feature_select_strategy", "full" if onevision else "default"
    )
    if not isinstance(feature_layer, int) or feature_select not in FEATURE_SELECTS:
        raise ValueError(
            f"Unsupported {architecture} variant: vision_feature_layer {feature_layer!r} with "
            f"vision_feature_select_strategy {feature_select!r}."
        )
    image_token_id = config.get("image_token_id", config.get("image_token_index", 32000))
    tiled = architecture != LLAVA_CLASS
    pinpoints = _pinpoints(config, model_dir, vision["image_size"]) if tiled else ()
    if tiled and model_type == "clip_vision_model" and feature_select != "default":
        raise ValueError(
            f"Unsupported {architecture} variant: a CLIP tower's class token kept "
            "(vision_feature_select_strategy full) leaves no square grid of features."
        )
    return VisionConfig(
        hidden_size=vision["hidden_size"],
        intermediate_size=vision["intermediate_size"],
        num_hidden_layers=vision["num_hidden_layers"],
        num_attention_heads=vision["num_attention_heads"],
        image_size=vision["image_size"],
        patch_size=vision["patch_size"],
        image_token_id=image_token_id,
        tower=model_type.removesuffix("_vision_model"),
        use_head=model_type == "siglip_vision_model" and vision.get("vision_use_head", True),
        num_channels=vision["num_channels"],
        layer_norm_eps=vision["layer_norm_eps"],
        hidden_act=vision["hidden_act"],
        feature_layer=feature_layer,
        feature_select=feature_select,
        projector_act=config.get("projector_hidden_act", "gelu"),
        projector_bias=config.get("multimodal_projector_bias", True),
        grid_pinpoints=pinpoints,
        max_grid_tiles=_max_grid_tiles(config) if onevision else 0,
        video_token_id=_video_token(config) if onevision else None,
        **_preprocessing(model_dir / "preprocessor_config.json", vision["image_size"], tiled),
    )


def _video_token(config: dict) -> int | None:
    """LLaVA-OneVision's ``<video>`` token; None when the vocabulary has no such id (a checkpoint
    that reads no videos)."""
    token = config.get("video_token_id", config.get("video_token_index", 151647))
    vocab_size = (config.get("text_config") or {}).get("vocab_size", config.get("vocab_size", 0))
    return token if token < vocab_size else None


def _max_grid_tiles(config: dict) -> int:
    """N of LLaVA-OneVision's ``vision_aspect_ratio`` ``anyres_max_N``; ValueError for another."""
    aspect = config.get("vision_aspect_ratio", "anyres_max_9")
    count = aspect.removeprefix("anyres_max_")
    if not aspect.startswith("anyres_max_") or not count.isdigit() or not int(count):
        raise ValueError(
            f"Unsupported {LLAVA_ONEVISION_CLASS} variant: vision_aspect_ratio {aspect!r} "
            "(anyres_max_N runs here)."
        )
    return int(count)


def _pinpoints(config: dict, model_dir: Path, image_size: int) -> tuple[tuple[int, int], ...]:
    """LLaVA-NeXT's and OneVision's grid resolutions ``(height, width)``; ValueError when one is
    no whole grid of tower-sized tiles or the image processor's differ from the model's."""
    default = _PINPOINTS[config["architectures"][0]]
    pinpoints = tuple(tuple(p) for p in config.get("image_grid_pinpoints", default))
    if any(side % image_size for pinpoint in pinpoints for side in pinpoint):
        raise ValueError(
            f"image_grid_pinpoints {[list(p) for p in pinpoints]} are not all whole grids of "
            f"the tower's {image_size}-pixel tiles."
        )
    path = model_dir / "preprocessor_config.json"
    processor = json.loads(path.read_text()) if path.is_file() else {}
    theirs = tuple(tuple(p) for p in processor.get("image_grid_pinpoints", pinpoints))
    if theirs != pinpoints:
        raise ValueError(
            "preprocessor_config.json's image_grid_pinpoints differ from config.json's."
        )
    return pinpoints


def _preprocessing(path: Path, image_size: int, tiled: bool = False) -> dict:
    """`VisionConfig`'s preprocessing fields from a CLIP, LLaVA or LLaVA-NeXT (``tiled``: its
    tiles are square already, and its ``do_pad`` pads batches, not images) image processor's
    config."""
    if not path.is_file():
        return {"resize_shortest_edge": image_size}
    processor = json.loads(path.read_text())
    size, crop = processor.get("size") or {}, processor.get("crop_size") or image_size
    crop = crop if isinstance(crop, int) else crop.get("height", image_size)
    if crop != image_size:
        raise ValueError(
            f"preprocessor_config.json crops images to {crop} pixels; the vision tower takes "
            f"{image_size}."
        )
    shortest = size if isinstance(size, int) else size.get("shortest_edge", 0)
    if not shortest and any(
        size.get(side, image_size) != image_size for side in ("height", "width")
    ):
        raise ValueError(
            f"preprocessor_config.json resizes images to {size}; the vision tower takes "
            f"{image_size} x {image_size}."
        )
    check_steps_on(processor)
    square = tiled or processor.get("do_center_crop", True) or processor.get("do_pad")
    if shortest and not square:
        raise ValueError(
            "preprocessor_config.json resizes images by their shortest edge without cutting "
            "them square; the vision tower takes square images."
        )
    fields = {
        "resize_shortest_edge": shortest,
        "center_crop": processor.get("do_center_crop", True),
        "pad_to_square": not tiled and processor.get("do_pad", False),
        "resample": processor.get("resample", 3),
        "rescale_factor": processor.get("rescale_factor", 1 / 255),
    }
    for key in ("image_mean", "image_std"):
        if processor.get(key):
            fields[key] = tuple(processor[key])
    return fields


def check_steps_on(processor: dict) -> None:
    """ValueError when an image processor's config turns off resizing, rescaling or
    normalizing, which Spyglass always does."""
    if not all(processor.get(step, True) for step in ("do_resize", "do_rescale", "do_normalize")):
        raise ValueError(
            "preprocessor_config.json turns off resizing, rescaling or normalizing, which "
            "Spyglass always does."
        )


def canonical_names(weights: dict) -> dict:
    """``weights`` under the names the models read: the language model's as its causal LM's
    (``model.``, ``lm_head.``), the tower's under ``vision_tower.``, the projector's under
    ``multi_modal_projector.``."""
    return with_prefixes_renamed(weights, _RENAMES)


def with_prefixes_renamed(weights: dict, renames: tuple[tuple[str, str], ...]) -> dict:
    """``weights`` with each ``(old, new)`` prefix of ``renames`` replaced, in order, wherever it
    starts a name (a rename may apply to what an earlier one made)."""
    renamed = {}
    for name, tensor in weights.items():
        for old, new in renames:
            if name.startswith(old):
                name = new + name[len(old) :]
        renamed[name] = tensor
    return renamed
