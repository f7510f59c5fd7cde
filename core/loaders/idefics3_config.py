"""Read an Idefics3 or SmolVLM directory's config (``Idefics3ForConditionalGeneration``,
``SmolVLMForConditionalGeneration``): its language model's config as a Llama causal LM would have
it, the `VisionConfig` of its tower, pixel shuffle and image splitting (``preprocessor_config.json``,
the tokenizer's tile tokens); and its checkpoint's parameter names mapped to the ones the models
use."""

from pathlib import Path

from spyglass.core.loaders.image_processor_config import image_processor_config, pixel_scaling
from spyglass.core.loaders.llava_config import (
    LLAMA_DEFAULTS,
    check_steps_on,
    with_prefixes_renamed,
)
from spyglass.core.models.image_tiles import ImageTiles
from spyglass.core.models.vision_config import VisionConfig
from spyglass.core.tokenizer import Tokenizer

IDEFICS3_CLASSES = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")

# Idefics3VisionConfig's defaults, for keys a config.json leaves out.
_TOWER_DEFAULTS = {
    "hidden_size": 1152,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
# Idefics3ImageProcessor's defaults, for keys a preprocessor_config.json leaves out.
_PROCESSOR_DEFAULTS = {
    "size": {"longest_edge": 4 * 364},
    "max_image_size": {"longest_edge": 364},
    "do_image_splitting": True,
    "resample": 1,  # Lanczos
    "rescale_factor": 1 / 255,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
_RENAMES = (
    ("model.text_model.", "model."),
    ("model.vision_model.", "vision_tower."),
    ("model.connector.modality_projection.", "multi_modal_projector."),
)
FAKE_TOKEN = "<fake_token_around_image>"
GLOBAL_TOKEN = "<global-img>"


def is_idefics3(config: dict) -> bool:
    """Whether ``config`` (a config.json) is an Idefics3 or SmolVLM model's."""
    return (config.get("architectures") or [None])[0] in IDEFICS3_CLASSES


def text_config(config: dict) -> dict:
    """The language model's config as a ``LlamaForCausalLM`` config.json; ValueError for another
    family. Tying the output to the embedding is the outer config's choice, as in transformers."""
    text = dict(config.get("text_config") or {})
    if text.get("model_type", "llama") != "llama":
        raise ValueError(
            f"Unsupported {config['architectures'][0]} variant: a {text['model_type']!r} language "
            "model (Llama's runs)."
        )
    return {
        **LLAMA_DEFAULTS,
        "rms_norm_eps": 1e-5,
        **text,
        "tie_word_embeddings": config.get("tie_word_embeddings", False),
        "architectures": ["LlamaForCausalLM"],
    }


def check_vision(config: dict, model_dir: Path) -> tuple[dict, dict]:
    """The tower's config and the image processor's, with their defaults filled in; ValueError
    for what does not run here."""
    tower = {**_TOWER_DEFAULTS, **(config.get("vision_config") or {})}
    processor = {**_PROCESSOR_DEFAULTS, **image_processor_config(model_dir)}
    tile_size = processor["max_image_size"]["longest_edge"]
    if tile_size != tower["image_size"]:
        raise ValueError(
            f"preprocessor_config.json cuts images into {tile_size}-pixel tiles; the vision tower "
            f"takes {tower['image_size']}."
        )
    check_steps_on(processor)
    return tower, processor


def vision_config(config: dict, model_dir: Path, tokenizer: Tokenizer) -> VisionConfig:
    """The vision side of ``config``, of ``model_dir``'s image processor config
    (`check_vision`) and of the tokenizer's tile tokens."""
    tower, processor = check_vision(config, model_dir)
    longest_edge, tile_size = processor["size"]["longest_edge"], tower["image_size"]
    tiles = ImageTiles(
        longest_edge=longest_edge,
        tile_size=tile_size,
        split=processor["do_image_splitting"],
        **_tile_tokens(tokenizer, -(-longest_edge // tile_size)),
    )
    return VisionConfig(
        hidden_size=tower["hidden_size"],
        intermediate_size=tower["intermediate_size"],
        num_hidden_layers=tower["num_hidden_layers"],
        num_attention_heads=tower["num_attention_heads"],
        image_size=tile_size,
        patch_size=tower["patch_size"],
        image_token_id=config.get("image_token_id", 128257),
        tower="idefics3",
        num_channels=tower["num_channels"],
        layer_norm_eps=tower["layer_norm_eps"],
        hidden_act=tower["hidden_act"],
        feature_layer=-1,
        feature_select="full",
        center_crop=False,
        **pixel_scaling(processor),
        scale_factor=config.get("scale_factor", 2),
        tiles=tiles,
    )


def _tile_tokens(tokenizer: Tokenizer, grid: int) -> dict:
    """`ImageTiles`' token fields for splits of up to ``grid`` x ``grid`` tiles; ValueError when
    the tokenizer lacks one of the tile tokens."""

    def token_id(name: str) -> int:
        found = tokenizer.backend.token_to_id(name)
        if found is None:
            raise ValueError(
                f"the tokenizer has no {name} token, which Idefics3 prompts put around image tiles"
            )
        return found

    return {
        "fake_token_id": token_id(FAKE_TOKEN),
        "global_token_id": token_id(GLOBAL_TOKEN),
        "row_col_token_ids": tuple(
            tuple(token_id(f"<row_{row}_col_{col}>") for col in range(1, grid + 1))
            for row in range(1, grid + 1)
        ),
        "newline_ids": tuple(tokenizer.encode("\n", add_special_tokens=False)),
        "last_row_end_ids": tuple(tokenizer.encode("\n\n", add_special_tokens=False)),
    }


def canonical_names(weights: dict) -> dict:
    """``weights`` under the names the models read: the language model's as Llama's
    (``model.``, ``lm_head.``), the tower's under ``vision_tower.``, the projection's under
    ``multi_modal_projector.``."""
    return with_prefixes_renamed(weights, _RENAMES)
