"""LLaVA-NeXT's "any resolution" preprocessing, from an RGB image to its tiles, as transformers'
PIL-based ``LlavaNextImageProcessorPil`` computes them: the whole image squashed to one tile (the
base image), then the image scaled to fit the best grid resolution (`anyres.best_resolution`),
centred on black padding and cut into tiles row by row."""

import math
from typing import TYPE_CHECKING

from spyglass.core.models.anyres import best_resolution
from spyglass.core.models.vision_config import VisionConfig

if TYPE_CHECKING:
    from PIL import Image


def _fitted_size(width: int, height: int, fit_width: int, fit_height: int) -> tuple[int, int]:
    """``(width, height)`` scaled to fit ``fit_width`` x ``fit_height``, the scaled side rounded
    up (transformers' ``get_patch_output_size``)."""
    scale_width, scale_height = fit_width / width, fit_height / height
    if scale_width < scale_height:
        return fit_width, min(math.ceil(height * scale_width), fit_height)
    return min(math.ceil(width * scale_height), fit_width), fit_height


def anyres_tiles(image: "Image.Image", vision: VisionConfig) -> "list[Image.Image]":
    """The base image, then the grid's tiles row by row, each ``image_size`` square."""
    from PIL import Image

    size = vision.image_size
    fit_height, fit_width = best_resolution(*image.size, vision.grid_pinpoints)
    width, height = _fitted_size(*image.size, fit_width, fit_height)
    fitted = Image.new("RGB", (fit_width, fit_height))
    fitted.paste(
        image.resize((width, height), resample=vision.resample),
        ((fit_width - width) // 2, (fit_height - height) // 2),
    )
    grid = [
        fitted.crop((left, top, left + size, top + size))
        for top in range(0, fit_height, size)
        for left in range(0, fit_width, size)
    ]
    return [image.resize((size, size), resample=vision.resample), *grid]
