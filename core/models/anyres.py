"""LLaVA-NeXT's "any resolution" geometry: the grid resolution an image is fitted into, and the
image's features once the grid's padding is cut away. Shared by the preprocessing, the prompt
layout and the model, so the three always agree."""

import math
from dataclasses import dataclass

from spyglass.core.models.vision_config import VisionConfig


def best_resolution(
    width: int, height: int, pinpoints: tuple[tuple[int, int], ...]
) -> tuple[int, int]:
    """The ``(height, width)`` of ``pinpoints`` that keeps the most of the image's pixels once it
    is scaled to fit, then wastes the least (transformers' ``select_best_resolution``)."""
    best, most_kept, least_wasted = pinpoints[0], 0, float("inf")
    for fit_height, fit_width in pinpoints:
        scale = min(fit_width / width, fit_height / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = fit_width * fit_height - kept
        if kept > most_kept or (kept == most_kept and wasted < least_wasted):
            best, most_kept, least_wasted = (fit_height, fit_width), kept, wasted
    return best


def tile_grid(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """The ``(rows, cols)`` of tower-sized tiles the image's best resolution holds."""
    fit_height, fit_width = best_resolution(width, height, vision.grid_pinpoints)
    return fit_height // vision.image_size, fit_width // vision.image_size


@dataclass(frozen=True, slots=True)
class UnpaddedGrid:
    """The grid's feature map (patches) with its padding cut away: ``rows`` x ``cols`` of it,
    from row ``top`` and column ``left`` of the whole map."""

    rows: int
    cols: int
    top: int
    left: int


def unpadded_grid(width: int, height: int, vision: VisionConfig) -> UnpaddedGrid:
    """The image's part of its grid's feature map: a wider image than the grid loses as many
    padding rows top and bottom, a taller one columns left and right (transformers'
    ``unpad_image``, its rounding included)."""
    side = vision.image_size // vision.patch_size
    grid_rows, grid_cols = tile_grid(width, height, vision)
    rows, cols = grid_rows * side, grid_cols * side
    if width / height > cols / rows:
        padding = (rows - int(round(height * (cols / width), 7))) // 2
        return UnpaddedGrid(rows - 2 * padding, cols, padding, 0)
    padding = (cols - int(round(width * (rows / height), 7))) // 2
    return UnpaddedGrid(rows, cols - 2 * padding, 0, padding)


def grid_features(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """The ``(rows, cols)`` of grid features an image becomes: the unpadded grid's, or, past 1.1
    times ``max_grid_tiles`` tiles' worth, that shrunk by the square root of the excess
    (LLaVA-OneVision's ``anyres_max``; transformers' rounding)."""
    grid = unpadded_grid(width, height, vision)
    if not vision.max_grid_tiles:
        return grid.rows, grid.cols
    side = vision.image_size // vision.patch_size
    ratio = math.sqrt(grid.rows * grid.cols / (vision.max_grid_tiles * side**2))
    if ratio <= 1.1:
        return grid.rows, grid.cols
    return int(grid.rows // ratio), int(grid.cols // ratio)


def num_image_tokens(width: int, height: int, vision: VisionConfig, alone: bool = True) -> int:
    """The prompt tokens an image becomes: the base image's, then its grid features, each row of
    them ending in the learned ``image_newline``. LLaVA-OneVision reads an image that is not
    ``alone`` in its prompt as the base image and one newline."""
    if vision.max_grid_tiles and not alone:
        return vision.tokens_per_tile + 1
    rows, cols = grid_features(width, height, vision)
    return vision.tokens_per_tile + rows * (cols + 1)
