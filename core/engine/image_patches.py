"""Qwen2-VL's pixels as its tower reads them: flat patches, each merged square's together, each
patch's values over ``temporal_patch_size`` frames (an image repeated; a video's frames in turn,
its last repeated to fill the last step), as transformers' ``Qwen2VLImageProcessor`` and
``Qwen2VLVideoProcessor`` cut them."""

import torch

from spyglass.core.models.vision_config import VisionConfig


def image_patches(frames: torch.Tensor, vision: VisionConfig) -> torch.Tensor:
    """``frames [frames, channels, height, width]`` (both multiples of a merged patch; one frame
    for an image) as ``[steps * patches, patch_pixels]``: step by step (``temporal_patch_size``
    frames each), merged squares row by row, their patches row by row, each patch's values
    channel by channel, frame by frame, row by row."""
    count, channels, height, width = frames.shape
    side, merge, per_step = vision.patch_size, vision.scale_factor, vision.temporal_patch_size
    steps = -(-count // per_step)
    padding = frames[-1:].expand(steps * per_step - count, channels, height, width)
    frames = torch.cat([frames, padding])
    rows, cols = height // side, width // side
    grid = frames.reshape(
        steps, per_step, channels, rows // merge, merge, side, cols // merge, merge, side
    )
    grid = grid.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return grid.reshape(steps * rows * cols, vision.patch_pixels).contiguous()
