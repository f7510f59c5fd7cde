"""How Pixtral (Mistral 3's tower) sizes an image: scaled down, keeping its aspect, until its
longer side fits ``image_size``, then each side rounded up to a whole number of merged patches
(transformers' ``PixtralImageProcessor`` with its processor's patch size times
``spatial_merge_size``); each merged patch one prompt token, a row of them ended by a break."""

import math

from spyglass.core.models.vision_config import VisionConfig


def resized_size(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """``(width, height)`` the processor resizes an image of ``width`` x ``height`` to."""
    ratio = max(height / vision.image_size, width / vision.image_size)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    factor = vision.patch_size * vision.scale_factor
    return (width - 1) // factor * factor + factor, (height - 1) // factor * factor + factor


def token_grid(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """``(rows, columns)`` of the prompt tokens the image becomes (merged patches)."""
    resized_width, resized_height = resized_size(width, height, vision)
    factor = vision.patch_size * vision.scale_factor
    return resized_height // factor, resized_width // factor
