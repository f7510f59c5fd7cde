"""How Qwen2-VL sizes an image: resized to multiples of a merged patch (`resized_size`, transformers'
``smart_resize``), cut into patches of ``patch_size``, every ``scale_factor`` x ``scale_factor``
of them merged into one prompt token."""

import math

from spyglass.core.models.vision_config import VisionConfig

MAX_ASPECT_RATIO = 200
"""The longest an image's longer side may be against its shorter, as Qwen2-VL's processor allows."""


def resized_size(
    width: int, height: int, vision: VisionConfig, video: bool = False
) -> tuple[int, int]:
    """``(width, height)`` as the processor resizes the image: each side rounded to a multiple of
    a merged patch, then scaled down or up (keeping the aspect) into ``[min_pixels, max_pixels]``
    (a ``video``'s frames: ``[video_min_pixels, video_max_pixels]``). ValueError for an image
    longer than `MAX_ASPECT_RATIO` times its width (or the reverse)."""
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ValueError(
            f"an image's sides may differ at most {MAX_ASPECT_RATIO} times "
            f"({width} x {height} is too narrow)"
        )
    factor = vision.patch_size * vision.scale_factor
    min_pixels, max_pixels = (
        (vision.video_min_pixels, vision.video_max_pixels)
        if video
        else (vision.min_pixels, vision.max_pixels)
    )
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def patch_grid(
    width: int, height: int, vision: VisionConfig, video: bool = False
) -> tuple[int, int]:
    """``(rows, columns)`` of patches the tower reads for an image (a ``video``'s frame) of
    ``width`` x ``height``."""
    resized_width, resized_height = resized_size(width, height, vision, video)
    return resized_height // vision.patch_size, resized_width // vision.patch_size


def token_grid(
    width: int, height: int, vision: VisionConfig, video: bool = False
) -> tuple[int, int]:
    """``(rows, columns)`` of the prompt tokens the image (a ``video``'s frame) becomes (merged
    patches)."""
    rows, cols = patch_grid(width, height, vision, video)
    return rows // vision.scale_factor, cols // vision.scale_factor
