"""Idefics3's (SmolVLM's) image encoder: a SigLIP tower whose position embeddings are looked up
by NaViT's fractional buckets, its final LayerNorm, then a pixel shuffle that merges each
``scale_factor`` x ``scale_factor`` square of patches into one token and a linear projection into
the language model's embedding space. Plain tensors, as the decoders are."""

import torch
import torch.nn.functional as F

from spyglass.core.models.clip_vision import PROJECTOR, tower_weights
from spyglass.core.models.siglip_tower import SiglipTower
from spyglass.core.models.vision_config import VisionConfig


def patch_position_ids(patches_per_side: int) -> torch.Tensor:
    """The position embedding row of each patch of a whole (unpadded) tile, row by row, as
    ``Idefics3VisionEmbeddings`` buckets them: each patch's fractional coordinate (its index times
    ``1 / patches_per_side``, in float32) placed among the boundaries ``k / patches_per_side``.
    Computed as transformers does, so float32 rounding puts a patch in the same bucket."""
    step = 1.0 / torch.tensor(patches_per_side)
    fractions = torch.clamp(
        torch.arange(patches_per_side, dtype=torch.float32) * step, max=1 - 1e-6
    )
    boundaries = torch.arange(1 / patches_per_side, 1.0, 1 / patches_per_side)
    buckets = torch.bucketize(fractions, boundaries, right=True)
    return (buckets[:, None] * patches_per_side + buckets[None, :]).flatten()


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """``x [tiles, side * side, dim]`` (patches row by row) as ``[tiles, side * side / scale²,
    dim * scale²]``: each ``scale`` x ``scale`` square of patches one token, its patches' features
    side by side, row by row within the square (``Idefics3Connector.pixel_shuffle``)."""
    tiles, positions, dim = x.shape
    side = int(positions**0.5)
    grid = side // scale
    x = x.view(tiles, grid, scale, grid, scale, dim).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(tiles, grid * grid, scale * scale * dim)


class Idefics3VisionEncoder:
    """Tiles to image tokens: SigLIP's tower with `patch_position_ids`' embeddings, then
    `pixel_shuffle` and the projection. Takes the `vision_weight_names` weights (other keys are
    ignored), on ``device`` in ``dtype``."""

    def __init__(self, vision: VisionConfig, weights: dict[str, torch.Tensor], device, dtype):
        side = vision.image_size // vision.patch_size
        if side % vision.scale_factor:
            raise ValueError(
                f"scale_factor {vision.scale_factor} does not divide the tower's {side} patches a side"
            )
        self.vision = vision
        w = tower_weights(vision, weights, device, dtype)
        self.tower = SiglipTower(vision, w, patch_position_ids(side))
        self.projection = w[f"{PROJECTOR}.proj.weight"]

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The image tokens ``[tiles, tokens_per_tile, text_hidden]`` in the encoder's dtype for
        ``pixel_values [tiles, channels, image_size, image_size]``."""
        x = self.tower(pixel_values)
        return F.linear(pixel_shuffle(x, self.vision.scale_factor), self.projection)
