"""vLLM's ``mm_processor_kwargs`` as an engine option: a vision model's image processor settings
changed for every request, as if its processor config said so (Qwen2-VL's pixel bounds,
Idefics3's splitting)."""

import dataclasses

from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.models.vision_config import VisionConfig


def with_processor_options(checkpoint: Checkpoint, options: dict) -> Checkpoint:
    """``checkpoint`` with its vision config changed by ``options``; unchanged without options.
    ValueError naming what a model's image processor does not take, or a value out of range."""
    if not options:
        return checkpoint
    vision = checkpoint.arch.vision
    if vision is None:
        raise ValueError("mm_processor_kwargs need a vision model; this model reads no images")
    if vision.temporal_patch_size:
        changed = _pixel_bounds(vision, options)
    elif vision.tiles is not None:
        changed = _splitting(vision, options)
    else:
        raise ValueError(
            f"mm_processor_kwargs {sorted(options)}: this model's image processor takes none"
        )
    return dataclasses.replace(
        checkpoint, arch=dataclasses.replace(checkpoint.arch, vision=changed)
    )


def _check_names(options: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"mm_processor_kwargs {unknown} are not options of this model's image processor "
            f"(it takes {', '.join(known)})"
        )


def _pixel_bounds(vision: VisionConfig, options: dict) -> VisionConfig:
    """Qwen2-VL's ``min_pixels`` and ``max_pixels``: whole numbers, the least at most the most,
    the most at least one merged patch; for images and video frames alike (transformers passes a
    processor's call options to its image and video processors both)."""
    _check_names(options, ("min_pixels", "max_pixels"))
    least = options.get("min_pixels", vision.min_pixels)
    most = options.get("max_pixels", vision.max_pixels)
    merged_patch = (vision.patch_size * vision.scale_factor) ** 2
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (least, most)):
        raise ValueError("mm_processor_kwargs min_pixels and max_pixels must be whole numbers")
    if not 1 <= least <= most or most < merged_patch:
        raise ValueError(
            f"mm_processor_kwargs need 1 <= min_pixels <= max_pixels and max_pixels >= "
            f"{merged_patch} (one merged patch); got {least} and {most}"
        )
    bounds = {"min_pixels": least, "max_pixels": most}
    if vision.video_token_id is not None:
        bounds |= {
            "video_min_pixels": options.get("min_pixels", vision.video_min_pixels),
            "video_max_pixels": options.get("max_pixels", vision.video_max_pixels),
        }
    return dataclasses.replace(vision, **bounds)


def _splitting(vision: VisionConfig, options: dict) -> VisionConfig:
    """Idefics3's ``do_image_splitting``: a boolean."""
    _check_names(options, ("do_image_splitting",))
    split = options["do_image_splitting"]
    if not isinstance(split, bool):
        raise ValueError("mm_processor_kwargs do_image_splitting must be true or false")
    return dataclasses.replace(vision, tiles=dataclasses.replace(vision.tiles, split=split))
