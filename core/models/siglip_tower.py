"""SigLIP's tower read to its end, as Idefics3 and Gemma 3 read it: the patch embeddings plus
position embeddings, every encoder layer, then the final LayerNorm. Plain tensors, as the
decoders are."""

import torch
import torch.nn.functional as F

from spyglass.core.models.clip_vision import TOWER, ClipEncoderLayer
from spyglass.core.models.vision_config import VisionConfig


class SiglipTower:
    """Tiles to the final LayerNorm's output ``[tiles, patches, hidden]``; each patch, row by
    row, adds row ``position_ids[patch]`` of the position embeddings. Reads the tower's
    weights (canonical names, on the device in the activations' dtype)."""

    def __init__(
        self, vision: VisionConfig, weights: dict[str, torch.Tensor], position_ids: torch.Tensor
    ):
        self.vision = vision
        self.patch_embedding = (
            weights[f"{TOWER}.embeddings.patch_embedding.weight"],
            weights[f"{TOWER}.embeddings.patch_embedding.bias"],
        )
        positions = weights[f"{TOWER}.embeddings.position_embedding.weight"]
        self.position_embedding = positions[position_ids.to(positions.device)]
        self.layers = [
            ClipEncoderLayer(vision, weights, f"{TOWER}.encoder.layers.{i}")
            for i in range(vision.num_hidden_layers)
        ]
        self.post_norm = (
            weights[f"{TOWER}.post_layernorm.weight"],
            weights[f"{TOWER}.post_layernorm.bias"],
        )

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm's output for ``pixel_values [tiles, channels, size, size]``."""
        vision = self.vision
        x = pixel_values.to(self.position_embedding.device, self.position_embedding.dtype)
        x = F.conv2d(x, *self.patch_embedding, stride=vision.patch_size).flatten(2).transpose(1, 2)
        x = x + self.position_embedding
        for layer in self.layers:
            x = layer(x)
        return F.layer_norm(x, (vision.hidden_size,), *self.post_norm, vision.layer_norm_eps)
