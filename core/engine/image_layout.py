"""The prompt tokens one image becomes: LLaVA's run of placeholders, or Idefics3's tiles, each
behind its row and column token, and the global image."""

from dataclasses import dataclass

from spyglass.core.models.vision_config import VisionConfig


@dataclass(frozen=True, slots=True)
class ImageLayout:
    """The tokens an image's placeholder expands to, and where each of its tiles' runs of
    ``tile_tokens`` image tokens starts among them (the tower encodes the tiles in that order)."""

    token_ids: tuple[int, ...]
    tile_offsets: tuple[int, ...]
    tile_tokens: int


def image_layout(vision: VisionConfig, rows: int = 0, cols: int = 0) -> ImageLayout:
    """The layout of an image cut into ``rows`` x ``cols`` tiles (0 x 0: not split) plus the
    global image, as ``Idefics3Processor`` writes it; LLaVA's: `tokens_per_tile` placeholders."""
    run = (vision.image_token_id,) * vision.tokens_per_tile
    tiles = vision.tiles
    if tiles is None:
        return ImageLayout(run, (0,), len(run))
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
    return ImageLayout(tuple(tokens), tuple(offsets), len(run))
