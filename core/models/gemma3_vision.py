"""Gemma 3's image encoder: SigLIP's tower read to its end (`SiglipTower`), then each
``scale_factor`` x ``scale_factor`` square of patches averaged into one token, Gemma's RMSNorm
(scaled by one plus its weight) and a projection into the language model's embedding space
(``Gemma3MultiModalProjector``). Plain tensors, as the decoders are."""

import torch
import torch.nn.functional as F

from spyglass.core.models.clip_vision import PROJECTOR, TOWER, tower_weights
from spyglass.core.models.siglip_tower import SiglipTower
from spyglass.core.models.vision_config import VisionConfig

SOFT_NORM = f"{PROJECTOR}.mm_soft_emb_norm.weight"
PROJECTION = f"{PROJECTOR}.mm_input_projection_weight"


class Gemma3VisionEncoder:
    """Images to image tokens ``[images, tokens_per_tile, text_hidden]``. Takes the
    `vision_weight_names` weights (other keys are ignored), on ``device`` in ``dtype``."""

    def __init__(self, vision: VisionConfig, weights: dict[str, torch.Tensor], device, dtype):
        side = vision.image_size // vision.patch_size
        if side % vision.scale_factor:
            raise ValueError(
                f"{vision.tokens_per_tile} image tokens are no square grid of pooled patches of "
                f"the tower's {side} x {side}"
            )
        self.vision = vision
        w = tower_weights(vision, weights, device, dtype, (f"{TOWER}.head.",))
        self.tower = SiglipTower(vision, w, torch.arange(side * side))
        self.soft_norm = w[SOFT_NORM].float() + 1.0
        self.projection = w[PROJECTION]

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The image tokens for ``pixel_values [images, channels, image_size, image_size]``, in
        the encoder's dtype."""
        x = self.tower(pixel_values)
        images, positions, hidden = x.shape
        side = int(positions**0.5)
        grid = x.transpose(1, 2).reshape(images, hidden, side, side)
        pooled = F.avg_pool2d(grid, self.vision.scale_factor).flatten(2).transpose(1, 2)
        # Gemma's RMSNorm in float32, scaled by (1 + weight) before rounding back.
        squares = pooled.float().pow(2).mean(-1, keepdim=True)
        normed = pooled.float() * torch.rsqrt(squares + self.vision.layer_norm_eps)
        return torch.matmul((normed * self.soft_norm).to(x.dtype), self.projection)
