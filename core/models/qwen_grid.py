"""How Qwen2-VL sizes an image: resized to multiples of a merged patch (`resized_size`, transformers'
``smart_resize``), cut into patches of ``patch_size``, every ``scale_factor`` x ``scale_factor``
of them merged into one prompt token."""

import math

from spyglass.core.models.vision_config import VisionConfig

MAX_ASPECT_RATIO = 200
"""The longest an image's longer side may be against its shorter, as Qwen2-VL's processor allows."""


def resized_size(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """``(width, height)`` as the processor resizes the image: each side rounded to a multiple of
    a merged patch, then scaled down or up (keeping the aspect) into ``[min_pixels, max_pixels]``.
    ValueError for an image longer than `MAX_ASPECT_RATIO` times its width (or the reverse)."""
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ValueError(
            f"an image's sides may differ at most {MAX_ASPECT_RATIO} times "
            f"({width} x {height} is too narrow)"
        )
    factor = vision.patch_size * vision.scale_factor
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > vision.max_pixels:
        beta = math.sqrt(height * width / vision.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < vision.min_pixels:
        beta = math.sqrt(vision.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def patch_grid(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """``(rows, columns)`` of patches the tower reads for an image of ``width`` x ``height``."""
    resized_width, resized_height = resized_size(width, height, vision)
    return resized_height // vision.patch_size, resized_width // vision.patch_size


def token_grid(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """``(rows, columns)`` of the prompt tokens the image becomes (merged patches)."""
    rows, cols = patch_grid(width, height, vision)
    return rows // vision.scale_factor, cols // vision.scale_factor
