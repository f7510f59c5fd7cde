"""The prompt tokens one image becomes: LLaVA's run of placeholders (LLaVA-NeXT's as long as its
base image and unpadded grid), or Idefics3's tiles, each behind its row and column token, and the
global image."""

from dataclasses import dataclass

from spyglass.core.engine.image_tiling import tile_grid
from spyglass.core.models import anyres
from spyglass.core.models.vision_config import VisionConfig


@dataclass(frozen=True, slots=True)
class ImageLayout:
    """The tokens an image's placeholder expands to; the runs ``(offset, length)`` of image
    tokens among them, which take the image's embeddings in order; and how many tiles the tower
    reads for it."""

    token_ids: tuple[int, ...]
    runs: tuple[tuple[int, int], ...]
    num_tiles: int


def image_layout(vision: VisionConfig, width: int, height: int, alone: bool = True) -> ImageLayout:
    """The layout of an image of ``width`` x ``height`` pixels: LLaVA's `tokens_per_tile`
    placeholders (LLaVA-NeXT's `anyres.num_image_tokens`; ``alone``: the only image of its
    prompt), or, for Idefics3, its tiles (`image_tiling.tile_grid`) and the global image as
    ``Idefics3Processor`` writes them."""
    if vision.grid_pinpoints:
        count = anyres.num_image_tokens(width, height, vision, alone)
        if vision.max_grid_tiles and not alone:  # LLaVA-OneVision: the base image alone
            return ImageLayout((vision.image_token_id,) * count, ((0, count),), 1)
        rows, cols = anyres.tile_grid(width, height, vision)
        return ImageLayout((vision.image_token_id,) * count, ((0, count),), 1 + rows * cols)
    run = (vision.image_token_id,) * vision.tokens_per_tile
    tiles = vision.tiles
    if tiles is None:
        return ImageLayout(run, ((0, len(run)),), 1)
    rows, cols = tile_grid(width, height, tiles)
    tokens: list[int] = []
    offsets: list[int] = []
    for row in range(rows):
        for col in range(cols):
            tokens += (tiles.fake_token_id, tiles.row_col_token_ids[row][col])
            offsets.append(len(tokens))
            tokens += run
        tokens += tiles.newline_ids if row < rows - 1 else tiles.last_row_end_ids
    tokens += (tiles.fake_token_id, tiles.global_token_id)
    offsets.append(len(tokens))
    tokens += (*run, tiles.fake_token_id)
    return ImageLayout(tuple(tokens), tuple((at, len(run)) for at in offsets), len(offsets))
