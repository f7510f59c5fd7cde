"""Read a Qwen2-VL, Qwen2.5-VL or Qwen3-VL directory's config (``Qwen2VLForConditionalGeneration``,
``Qwen2_5_VLForConditionalGeneration``, ``Qwen3VLForConditionalGeneration``): its language
model's as a ``Qwen2ForCausalLM`` (Qwen3-VL's: ``Qwen3ForCausalLM``) config (with M-RoPE's
``mrope_section``), the `VisionConfig` of its tower and image processor; and its
checkpoint's parameter names mapped to the ones the models use."""

from pathlib import Path

from spyglass.core.loaders.image_processor_config import (
    image_processor_config,
    pixel_scaling,
    video_processor_config,
)
from spyglass.core.loaders.llava_config import check_steps_on, with_prefixes_renamed
from spyglass.core.loaders.qwen3_vl_video import timed_frames, video_pixels
from spyglass.core.models.vision_config import VisionConfig
from spyglass.core.tokenizer import Tokenizer

QWEN2_VL_CLASS = "Qwen2VLForConditionalGeneration"
QWEN2_5_VL_CLASS = "Qwen2_5_VLForConditionalGeneration"
QWEN3_VL_CLASS = "Qwen3VLForConditionalGeneration"
QWEN_VL_CLASSES = (QWEN2_VL_CLASS, QWEN2_5_VL_CLASS, QWEN3_VL_CLASS)

# Qwen2VLTextConfig's defaults, for keys a config.json leaves out.
_TEXT_DEFAULTS = {
    "vocab_size": 152064,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "rope_theta": 1000000.0,
}
# The towers' config classes' defaults.
_TOWER_DEFAULTS = {
    QWEN2_VL_CLASS: {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "mlp_ratio": 4},
    QWEN2_5_VL_CLASS: {
        "depth": 32,
        "hidden_size": 3584,
        "intermediate_size": 3420,
        "out_hidden_size": 3584,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
    },
    QWEN3_VL_CLASS: {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "patch_size": 16,
        "out_hidden_size": 3584,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24],
    },
}
_ACTIVATIONS = {
    QWEN2_VL_CLASS: "quick_gelu",
    QWEN2_5_VL_CLASS: "silu",
    QWEN3_VL_CLASS: "gelu_pytorch_tanh",
}
# The language model's class: Qwen3-VL's has Qwen3's q/k norms.
_TEXT_CLASSES = {
    QWEN2_VL_CLASS: "Qwen2ForCausalLM",
    QWEN2_5_VL_CLASS: "Qwen2ForCausalLM",
    QWEN3_VL_CLASS: "Qwen3ForCausalLM",
}
# Qwen2VLImageProcessor's defaults.
_PROCESSOR_DEFAULTS = {
    "min_pixels": 56 * 56,
    "max_pixels": 28 * 28 * 1280,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "resample": 3,  # bicubic
    "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
# Qwen2VLVideoProcessor's frame sizes, in pixels, where its config gives none.
_VIDEO_PIXELS = {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}
# The Hub's names (``visual.``, ``model.``) and transformers 5's (``model.visual.``,
# ``model.language_model.``) to the models' own.
_RENAMES = (
    ("model.visual.", "vision_tower."),
    ("visual.", "vision_tower."),
    ("model.language_model.", "model."),
)
# Config keys of the outer config that are not the language model's.
_OUTER_KEYS = ("vision_config", "text_config", "architectures", "model_type")


def is_qwen2_vl(config: dict) -> bool:
    """Whether ``config`` (a config.json) is a Qwen2-VL, Qwen2.5-VL or Qwen3-VL model's."""
    return (config.get("architectures") or [None])[0] in QWEN_VL_CLASSES


def text_config(config: dict) -> dict:
    """The language model's config as a ``Qwen2ForCausalLM`` config.json: the Hub's flat keys,
    or transformers 5's ``text_config``; tying is the outer config's say."""
    flat = {key: value for key, value in config.items() if key not in _OUTER_KEYS}
    text = {**_TEXT_DEFAULTS, **flat, **(config.get("text_config") or {})}
    text["tie_word_embeddings"] = config.get("tie_word_embeddings", False)
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if "mrope_section" not in rope:
        raise ValueError(
            f"{config['architectures'][0]}'s config.json has no rope mrope_section; its "
            "language model rotates by M-RoPE."
        )
    return {**text, "architectures": [_TEXT_CLASSES[config["architectures"][0]]]}


def vision_config(
    config: dict, model_dir: Path, tokenizer: Tokenizer | None = None
) -> VisionConfig:
    """The tower and image processor of ``config`` and ``model_dir`` (preprocessor_config.json,
    or processor_config.json's ``image_processor``), and its video processor's; ValueError for
    what does not run here. Qwen3-VL's videos are timed by text, which needs the ``tokenizer``
    (without it, the model's videos are left out: a check of the config alone)."""
    architecture = config["architectures"][0]
    tower = {**_TOWER_DEFAULTS[architecture], **(config.get("vision_config") or {})}
    processor = {**_PROCESSOR_DEFAULTS, **image_processor_config(model_dir)}
    size = processor.get("size") or {}
    min_pixels = size.get("shortest_edge", processor["min_pixels"])
    max_pixels = size.get("longest_edge", processor["max_pixels"])
    check_steps_on(processor)
    patch, merge = tower.get("patch_size", 14), tower.get("spatial_merge_size", 2)
    frames = tower.get("temporal_patch_size", 2)
    seen = (processor["patch_size"], processor["merge_size"], processor["temporal_patch_size"])
    if seen != (patch, merge, frames):
        raise ValueError(
            f"the image processor cuts patches of {seen[0]} pixels over {seen[2]} frames, merged "
            f"{seen[1]} x {seen[1]}; the vision tower takes {patch}, {frames} and {merge}."
        )
    qwen2, qwen3 = architecture == QWEN2_VL_CLASS, architecture == QWEN3_VL_CLASS
    width = tower["embed_dim"] if qwen2 else tower["hidden_size"]
    grid = round(tower.get("num_position_embeddings", 0) ** 0.5)
    if qwen3 and grid**2 != tower["num_position_embeddings"]:
        raise ValueError(
            f"num_position_embeddings {tower['num_position_embeddings']} is no square grid."
        )
    theta = (tower.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    if theta != 10000.0:
        raise ValueError(f"the vision tower's rope base is {theta}; its 2D rope runs at 10000.")
    text_width = text_config(config)["hidden_size"]
    projector_size = tower["hidden_size"] if qwen2 else tower["out_hidden_size"]
    if projector_size != text_width:
        raise ValueError(
            f"the vision tower's merger gives {projector_size}-wide tokens; the language model "
            f"is {text_width} wide."
        )
    return VisionConfig(
        hidden_size=width,
        intermediate_size=width * tower["mlp_ratio"] if qwen2 else tower["intermediate_size"],
        num_hidden_layers=tower["depth"],
        num_attention_heads=tower.get("num_heads", 16),
        image_size=patch * merge,
        patch_size=patch,
        image_token_id=config.get("image_token_id", 151655),
        tower={QWEN2_VL_CLASS: "qwen2_vl", QWEN3_VL_CLASS: "qwen3_vl"}.get(
            architecture, "qwen2_5_vl"
        ),
        num_channels=tower.get("in_channels", tower.get("in_chans", 3)),
        layer_norm_eps=1e-6,
        hidden_act=tower.get("hidden_act", _ACTIVATIONS[architecture]),
        feature_layer=-1,
        feature_select="full",
        center_crop=False,
        **pixel_scaling(processor),
        scale_factor=merge,
        temporal_patch_size=frames,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        projector_size=projector_size,
        window_size=tower.get("window_size", 0) if not qwen2 else 0,
        full_attention_layers=tuple(tower.get("fullatt_block_indexes", ())),
        position_grid=grid if qwen3 else 0,
        deepstack_layers=tuple(tower.get("deepstack_visual_indexes", ())) if qwen3 else (),
        **_video_fields(config, architecture, tower, processor, model_dir, tokenizer),
    )


def _video_fields(
    config: dict,
    architecture: str,
    tower: dict,
    image_processor: dict,
    model_dir: Path,
    tokenizer: Tokenizer | None,
) -> dict:
    """The `VisionConfig` fields of the model's videos: its video token and frame sizes (the
    video processor's ``min_pixels`` and ``max_pixels``, else its ``size``; Qwen3-VL's, for all
    its frames together, and its `TimedFrames`), and Qwen2.5-VL's ``tokens_per_second``."""
    processor = video_processor_config(model_dir)
    video = {"video_token_id": config.get("video_token_id", 151656)}
    if architecture == QWEN3_VL_CLASS:
        if tokenizer is None:
            return {}
        least, most = video_pixels(processor)
        timed = timed_frames(config, processor, image_processor, tokenizer)
        return {**video, "video_min_pixels": least, "video_max_pixels": most, "timed_frames": timed}
    size = {**_VIDEO_PIXELS, **(processor.get("size") or {})}
    return {
        **video,
        "video_min_pixels": processor.get("min_pixels", size["shortest_edge"]),
        "video_max_pixels": processor.get("max_pixels", size["longest_edge"]),
        "tokens_per_second": tower.get("tokens_per_second", 4)
        if architecture == QWEN2_5_VL_CLASS
        else 0.0,
    }


def canonical_names(weights: dict) -> dict:
    """``weights`` under the names the models read: the language model's as Qwen2's
    (``model.``, ``lm_head.``), the tower's and its merger's under ``vision_tower.``."""
    return with_prefixes_renamed(weights, _RENAMES)
