"""The prompt tokens one image becomes: LLaVA's run of placeholders (LLaVA-NeXT's as long as its
base image and unpadded grid; Qwen2-VL's as long as its grid of merged patches, a video's as
long as its steps' grids; Qwen3-VL's video steps each behind its time), or Idefics3's tiles,
each behind its row and column token, and the global image."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from spyglass.core.engine.image_tiling import tile_grid
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models import anyres, pixtral_grid, qwen_grid
from spyglass.core.models.vision_config import VisionConfig

if TYPE_CHECKING:
    from spyglass.core.engine.image_inputs import VideoClip


@dataclass(frozen=True, slots=True)
class ImageLayout:
    """The tokens an image's placeholder expands to; the runs ``(offset, length)`` of image
    tokens among them, which take the image's embeddings in order; and the shape of the pixels
    the tower reads for it (``[tiles, channels, side, side]``; Qwen2-VL's ``[patches, values]``);
    the prompt token that marks where it goes (None: `VisionConfig.placeholder_id`); the tokens
    ``(before, after)`` that, found around that mark in the prompt, the layout replaces too
    (Qwen3-VL's vision start and end around a video's mark: its steps hold their own)."""

    token_ids: tuple[int, ...]
    runs: tuple[tuple[int, int], ...]
    pixel_shape: tuple[int, ...]
    placeholder_id: int | None = None
    replaces_around: tuple[int, int] | None = None


def _tiles(vision: VisionConfig, count: int) -> tuple[int, ...]:
    return (count, vision.num_channels, vision.image_size, vision.image_size)


def image_layout(
    vision: VisionConfig,
    width: int,
    height: int,
    alone: bool = True,
    clip: "VideoClip | None" = None,
) -> ImageLayout:
    """The layout of an image of ``width`` x ``height`` pixels: LLaVA's `tokens_per_tile`
    placeholders (LLaVA-NeXT's `anyres.num_image_tokens`; ``alone``: the only image of its
    prompt; Gemma 3's between its prefix and suffix tokens), or, for Idefics3, its tiles
    (`image_tiling.tile_grid`) and the global image as ``Idefics3Processor`` writes them. A
    video's (``clip``, frames of that size): Qwen2-VL's video tokens, its steps' grids in turn
    (Qwen3-VL's each behind its time). ValueError for an image Qwen2-VL cannot read
    (`qwen_grid.resized_size`) and for a video to a model that reads none."""
    if clip is not None:
        return _video_layout(vision, width, height, clip)
    if vision.tower == "pixtral":
        return _pixtral_layout(vision, width, height)
    if vision.temporal_patch_size:
        rows, cols = qwen_grid.patch_grid(width, height, vision)
        count = rows * cols // vision.scale_factor**2
        pixels = (rows * cols, vision.patch_pixels)
        return ImageLayout((vision.image_token_id,) * count, ((0, count),), pixels)
    if vision.grid_pinpoints:
        count = anyres.num_image_tokens(width, height, vision, alone)
        if vision.max_grid_tiles and not alone:  # LLaVA-OneVision: the base image alone
            return ImageLayout((vision.image_token_id,) * count, ((0, count),), _tiles(vision, 1))
        rows, cols = anyres.tile_grid(width, height, vision)
        pixels = _tiles(vision, 1 + rows * cols)
        return ImageLayout((vision.image_token_id,) * count, ((0, count),), pixels)
    run = (vision.image_token_id,) * vision.tokens_per_tile
    tiles = vision.tiles
    if tiles is None:
        prefix, suffix = vision.image_prefix_ids, vision.image_suffix_ids
        tokens = (*prefix, *run, *suffix)
        return ImageLayout(tokens, ((len(prefix), len(run)),), _tiles(vision, 1))
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
    runs = tuple((at, len(run)) for at in offsets)
    return ImageLayout(tuple(tokens), runs, _tiles(vision, len(offsets)))


def _video_layout(vision: VisionConfig, width: int, height: int, clip: "VideoClip") -> ImageLayout:
    """Qwen2-VL's video tokens, its steps' grids in turn (Qwen3-VL's each behind its time and
    between the vision start and end); LLaVA-OneVision's, each frame's pooled features in turn
    and the video's newline."""
    if vision.video_token_id is None:
        raise ValueError(
            "this model reads no videos (Qwen2-VL, Qwen2.5-VL, Qwen3-VL and LLaVA-OneVision "
            "models read them)"
        )
    video, steps = vision.video_token_id, clip.steps
    if not vision.temporal_patch_size:
        count = steps * vision.video_tokens_per_frame + 1
        return ImageLayout((video,) * count, ((0, count),), _tiles(vision, steps), video)
    rows, cols = qwen_grid.patch_grid(width, height, vision, clip.frames)
    pixels = (steps * rows * cols, vision.patch_pixels)
    per_step = rows * cols // vision.scale_factor**2
    timed = vision.timed_frames
    if timed is None:
        return ImageLayout((video,) * (steps * per_step), ((0, steps * per_step),), pixels, video)
    tokens: list[int] = []
    runs = []
    for seconds in clip.step_times:
        tokens += (*timed.timestamp_ids(seconds), timed.start_id)
        runs.append((len(tokens), per_step))
        tokens += (video,) * per_step + (timed.end_id,)
    around = (timed.start_id, timed.end_id)
    return ImageLayout(tuple(tokens), tuple(runs), pixels, video, around)


def _pixtral_layout(vision: VisionConfig, width: int, height: int) -> ImageLayout:
    """Mistral 3's: a row of image tokens per row of merged patches, each ended by a break, the
    last by the image's end (``PixtralProcessor``), over the image at its resized size."""
    rows, cols = pixtral_grid.token_grid(width, height, vision)
    tokens: list[int] = []
    runs = []
    for row in range(rows):
        runs.append((len(tokens), cols))
        tokens += [vision.image_token_id] * cols
        tokens.append(vision.row_break_token_id if row < rows - 1 else vision.image_end_token_id)
    resized_width, resized_height = pixtral_grid.resized_size(width, height, vision)
    pixels = (1, vision.num_channels, resized_height, resized_width)
    return ImageLayout(tuple(tokens), tuple(runs), pixels)


def checked_layout(
    vision: VisionConfig,
    width: int,
    height: int,
    alone: bool,
    field: str,
    clip: "VideoClip | None" = None,
) -> ImageLayout:
    """`image_layout`, its ValueError an `InvalidRequestError` naming ``field``."""
    try:
        return image_layout(vision, width, height, alone, clip)
    except ValueError as error:
        raise InvalidRequestError(str(error), field) from None
