"""Qwen2-VL's image pixels as its tower reads them: flat patches, each merged square's together,
each patch repeated over the tower's frames (transformers' ``Qwen2VLImageProcessor.patchify``)."""

import torch

from spyglass.core.models.vision_config import VisionConfig


def image_patches(pixels: torch.Tensor, vision: VisionConfig) -> torch.Tensor:
    """``pixels [channels, height, width]`` (both multiples of a merged patch) as
    ``[patches, patch_pixels]``: merged squares row by row, their patches row by row, each
    patch's values channel by channel, frame by frame (the image repeated), row by row."""
    channels, height, width = pixels.shape
    side, merge, frames = vision.patch_size, vision.scale_factor, vision.temporal_patch_size
    rows, cols = height // side, width // side
    grid = pixels.reshape(channels, rows // merge, merge, side, cols // merge, merge, side)
    grid = grid.permute(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
    repeated = grid.expand(*grid.shape[:5], frames, side, side)
    return repeated.reshape(rows * cols, vision.patch_pixels).contiguous()
