"""Idefics3's (SmolVLM's) image splitting, from an RGB image to its tiles' pixels, as transformers'
PIL-based ``Idefics3ImageProcessorPil`` computes them: the longest edge resized to
``longest_edge``, the image resized up to multiples of the tile size and cut into tiles row by
row, then the whole resized image shrunk to one tile (the global image)."""

import math
from typing import TYPE_CHECKING

from spyglass.core.models.image_tiles import ImageTiles

if TYPE_CHECKING:  # prompt layouts use the sizes here; the engine's requests load without PIL
    from PIL import Image

MAX_IMAGE_SIDE = 4096
"""transformers' cap on either side of the first resize."""


def _longest_edge_size(width: int, height: int, longest: int) -> tuple[int, int]:
    """``(width, height)`` with the longest edge ``longest``, the other scaled, truncated and
    made even, at least 1 (``_resize_output_size_rescale_to_max_len``); then both scaled below
    `MAX_IMAGE_SIDE` by that size's aspect ratio (``_resize_output_size_scale_below_upper_bound``)."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        width, height = int(longest * aspect), longest
        width += width % 2
    width, height = max(width, 1), max(height, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIDE:
        width, height = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE / aspect)
    elif height > width and height > MAX_IMAGE_SIDE:
        width, height = int(MAX_IMAGE_SIDE * aspect), MAX_IMAGE_SIDE
    return max(width, 1), max(height, 1)


def _tile_multiple_size(width: int, height: int, tile: int) -> tuple[int, int]:
    """``(width, height)`` rounded up to multiples of ``tile``, the shorter side first taken from
    the longer's new length and the aspect ratio (``resize_for_vision_encoder``)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return width, height


def tile_grid(width: int, height: int, tiles: ImageTiles) -> tuple[int, int]:
    """The ``(rows, cols)`` an image of ``width`` x ``height`` pixels is split into; ``(0, 0)``
    when it is not (splitting off, or the resized image fits one tile)."""
    if not tiles.split:
        return 0, 0
    width, height = _tile_multiple_size(
        *_longest_edge_size(width, height, tiles.longest_edge), tiles.tile_size
    )
    if width <= tiles.tile_size and height <= tiles.tile_size:
        return 0, 0
    return height // tiles.tile_size, width // tiles.tile_size


def split_image(image: "Image.Image", tiles: ImageTiles, resample: int) -> "list[Image.Image]":
    """The tiles of the RGB ``image``, row by row, then the global image (the image alone when it
    is not split), each ``tile_size`` square; every resize on 8-bit pixels, as transformers'."""
    size = tiles.tile_size
    image = image.resize(_longest_edge_size(*image.size, tiles.longest_edge), resample=resample)
    if not tiles.split:
        return [image.resize((size, size), resample=resample)]
    image = image.resize(_tile_multiple_size(*image.size, size), resample=resample)
    width, height = image.size
    if width <= size and height <= size:
        return [image]
    cuts = [
        image.crop((left, top, left + size, top + size))
        for top in range(0, height, size)
        for left in range(0, width, size)
    ]
    return [*cuts, image.resize((size, size), resample=resample)]
