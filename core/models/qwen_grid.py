"""How Qwen2-VL sizes an image: resized to multiples of a merged patch (`resized_size`, transformers'
``smart_resize``), cut into patches of ``patch_size``, every ``scale_factor`` x ``scale_factor``
of them merged into one prompt token."""

import math

from spyglass.core.models.vision_config import VisionConfig

MAX_ASPECT_RATIO = 200
"""The longest an image's longer side may be against its shorter, as Qwen2-VL's processor allows."""


def resized_size(width: int, height: int, vision: VisionConfig, frames: int = 0) -> tuple[int, int]:
    """``(width, height)`` as the processor resizes the image: each side rounded to a multiple of
    a merged patch, then scaled down or up (keeping the aspect) into ``[min_pixels, max_pixels]``;
    a video's ``frames`` (0: an image) into ``[video_min_pixels, video_max_pixels]`` each, or,
    for Qwen3-VL (`VisionConfig.timed_frames`), all together (`clip_resized_size`). ValueError
    for an image longer than `MAX_ASPECT_RATIO` times its width (or the reverse)."""
    if frames and vision.timed_frames is not None:
        return clip_resized_size(width, height, frames, vision)
    _check_aspect(width, height)
    bounds = (
        (vision.video_min_pixels, vision.video_max_pixels)
        if frames
        else (vision.min_pixels, vision.max_pixels)
    )
    factor = vision.patch_size * vision.scale_factor
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    return _scaled_into(width, height, w_bar, h_bar, h_bar * w_bar, 1, bounds, factor)


def clip_resized_size(
    width: int, height: int, frames: int, vision: VisionConfig
) -> tuple[int, int]:
    """Qwen3-VL's frame size for a video of ``frames`` frames of ``width`` x ``height`` (as
    ``Qwen3VLVideoProcessor``'s ``smart_resize``): a frame under a merged patch a side scaled up
    to one, each side rounded to a multiple of a merged patch, then scaled so that the pixels of
    the frames (their count rounded to whole steps) fall into ``[video_min_pixels,
    video_max_pixels]`` (with `TimedFrames.frame_token_cap`, a budget of at most that many
    patches a frame, and at least 1.05 times the least). ValueError for fewer frames than a step
    and for sides that differ over `MAX_ASPECT_RATIO` times."""
    per_step = vision.temporal_patch_size
    if frames < per_step:
        raise ValueError(
            f"a video needs at least {per_step} frames here ({frames} given): send a single "
            "frame as an image"
        )
    factor = vision.patch_size * vision.scale_factor
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    _check_aspect(width, height)
    least, most = vision.video_min_pixels, vision.video_max_pixels
    cap = vision.timed_frames.frame_token_cap
    if cap:
        most = max(min(cap * factor * factor, most // frames), int(least * 1.05)) * frames
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    steps_frames = round(frames / per_step) * per_step
    pixels = steps_frames * h_bar * w_bar
    return _scaled_into(width, height, w_bar, h_bar, pixels, frames, (least, most), factor)


def _check_aspect(width: int, height: int) -> None:
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ValueError(
            f"an image's sides may differ at most {MAX_ASPECT_RATIO} times "
            f"({width} x {height} is too narrow)"
        )


def _scaled_into(
    width: int,
    height: int,
    w_bar: int,
    h_bar: int,
    pixels: int,
    frames: int,
    bounds: tuple[int, int],
    factor: int,
) -> tuple[int, int]:
    """``(w_bar, h_bar)``, the rounded size whose ``pixels`` (over all ``frames``) are counted,
    or, when they fall outside ``bounds``, ``width`` x ``height`` scaled (keeping the aspect) to
    about the bound, down to whole merged patches (``factor`` pixels) or up to them."""
    least, most = bounds
    if pixels > most:
        beta = math.sqrt(frames * height * width / most)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif pixels < least:
        beta = math.sqrt(least / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def patch_grid(width: int, height: int, vision: VisionConfig, frames: int = 0) -> tuple[int, int]:
    """``(rows, columns)`` of patches the tower reads for an image (a frame of a video of
    ``frames``) of ``width`` x ``height``."""
    resized_width, resized_height = resized_size(width, height, vision, frames)
    return resized_height // vision.patch_size, resized_width // vision.patch_size


def token_grid(width: int, height: int, vision: VisionConfig, frames: int = 0) -> tuple[int, int]:
    """``(rows, columns)`` of the prompt tokens the image (a frame of a video of ``frames``)
    becomes (merged patches)."""
    rows, cols = patch_grid(width, height, vision, frames)
    return rows // vision.scale_factor, cols // vision.scale_factor
