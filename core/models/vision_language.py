"""A vision-language model (LLaVA, LLaVA-NeXT, LLaVA-OneVision, Idefics3/SmolVLM, Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, Gemma 3, Mistral 3): a decoder that reads images, each turned into prompt embeddings by its
vision tower and projector (`clip_vision`, `idefics3_vision`, `qwen_vision`, `gemma3_vision`, `pixtral_vision`;
LLaVA-NeXT's grid packed as `anyres` lays it out)."""

import torch
import torch.nn.functional as F

from spyglass.core.models import anyres, qwen_grid
from spyglass.core.models.clip_vision import IMAGE_NEWLINE, ClipVisionEncoder
from spyglass.core.models.gemma import GemmaForCausalLM
from spyglass.core.models.gemma3_vision import Gemma3VisionEncoder
from spyglass.core.models.idefics3_vision import Idefics3VisionEncoder
from spyglass.core.models.llama import LlamaForCausalLM
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.pixtral_vision import PixtralVisionEncoder
from spyglass.core.models.qwen_vision import QwenVisionEncoder
from spyglass.kernels.backend import AttentionBackend

# The towers with encoders of their own (CLIP's and SigLIP's run `ClipVisionEncoder`).
_ENCODERS = {
    "idefics3": Idefics3VisionEncoder,
    "qwen2_vl": QwenVisionEncoder,
    "qwen2_5_vl": QwenVisionEncoder,
    "qwen3_vl": QwenVisionEncoder,
    "gemma3": Gemma3VisionEncoder,
    "pixtral": PixtralVisionEncoder,
}


class ImageEncoding:
    """The image side of a vision-language model, mixed into its language model's class (whose
    ``hidden_states`` take the embeddings `encode_images` gives as ``image_rows``: the runner
    passes them)."""

    def __init__(
        self,
        arch: ModelArchConfig,
        weights: dict[str, torch.Tensor],
        backend: AttentionBackend,
        device,
    ):
        super().__init__(arch, weights, backend, device)
        encoder = _ENCODERS.get(arch.vision.tower, ClipVisionEncoder)
        self.vision = encoder(arch.vision, weights, device, self.dtype)
        # LLaVA-NeXT's (and OneVision's) learned end of each row of an image's grid features.
        self.image_newline = (
            weights[IMAGE_NEWLINE].to(device=device, dtype=self.dtype)
            if arch.vision.grid_pinpoints
            else None
        )

    @torch.inference_mode()
    def encode_images(
        self,
        pixel_values: list[torch.Tensor],
        sizes: list[tuple[int, int]],
        video_frames: list[int] | None = None,
    ) -> list[torch.Tensor]:
        """Each image's prompt embeddings ``[tokens, hidden_size]``, in the activations' dtype,
        for its preprocessed tiles ``[tiles, channels, image_size, image_size]`` (Qwen2-VL's
        patches ``[patches, patch_pixels]``) and its own ``(width, height)``; the tiles of all
        the images run the tower together. Videos: ``video_frames`` (0: an image) of that size,
        Qwen2-VL's read in steps of ``temporal_patch_size`` frames, each step as an image of its
        own; LLaVA-OneVision's each frame a tile."""
        vision = self.arch.vision
        if vision.tower == "pixtral":  # images of their own sizes, one tile each
            return self.vision(pixel_values)
        if vision.temporal_patch_size:
            frames = video_frames or [0] * len(sizes)
            grids = [
                qwen_grid.patch_grid(*size, vision, count) for size, count in zip(sizes, frames)
            ]
            steps = [-(-count // vision.temporal_patch_size) for count in frames]
            step_grids = [grid for grid, count in zip(grids, steps) for _ in range(max(count, 1))]
            patches = torch.cat(pixel_values).to(self.final_norm.device)
            tokens = self.vision(patches, step_grids)
            per_step = [rows * cols // vision.scale_factor**2 for rows, cols in grids]
            return list(
                tokens.split([tokens * max(count, 1) for tokens, count in zip(per_step, steps)])
            )
        tiles = self.vision(torch.cat(pixel_values).to(self.final_norm.device))
        per_image = tiles.split([len(p) for p in pixel_values])
        if self.image_newline is None:
            return [embeds.flatten(0, 1) for embeds in per_image]
        videos = video_frames or [0] * len(sizes)
        return [
            self._pooled_frames(embeds) if video else self._pack_anyres(embeds, *size)
            for embeds, size, video in zip(per_image, sizes, videos)
        ]

    def _pooled_frames(self, embeds: torch.Tensor) -> torch.Tensor:
        """LLaVA-OneVision's video embeddings from its frames' ``[frames, side * side, hidden]``:
        each frame's grid pooled 2 x 2 (bilinear, rounded up), frame after frame, then one
        ``image_newline`` (transformers' ``get_video_features``)."""
        frames, positions, hidden = embeds.shape
        side = round(positions**0.5)
        grid = embeds.view(frames, side, side, hidden).permute(0, 3, 1, 2)
        pooled = F.interpolate(grid, size=[-(-side // 2)] * 2, mode="bilinear")
        return torch.cat([pooled.permute(0, 2, 3, 1).reshape(-1, hidden), self.image_newline[None]])

    def _pack_anyres(self, embeds: torch.Tensor, width: int, height: int) -> torch.Tensor:
        """LLaVA-NeXT's image embeddings from its tiles' ``[tiles, side * side, hidden]``: the base
        image's, then the grid's feature map with its padding cut away (`anyres.unpadded_grid`;
        LLaVA-OneVision's shrunk bilinearly to `anyres.grid_features`), row by row, each row
        followed by ``image_newline`` (transformers' ``pack_image_features``). A base image alone
        (LLaVA-OneVision's image among others) is followed by one ``image_newline``."""
        if len(embeds) == 1:
            return torch.cat([embeds[0], self.image_newline[None]])
        vision = self.arch.vision
        side = vision.image_size // vision.patch_size
        rows, cols = anyres.tile_grid(width, height, vision)
        grid = anyres.unpadded_grid(width, height, vision)
        features = (
            embeds[1:]
            .view(rows, cols, side, side, -1)
            .permute(0, 2, 1, 3, 4)
            .reshape(rows * side, cols * side, -1)
        )
        features = features[grid.top : grid.top + grid.rows, grid.left : grid.left + grid.cols]
        shrunk = anyres.grid_features(width, height, vision)
        if shrunk != (grid.rows, grid.cols):
            channels_first = features.permute(2, 0, 1)[None]
            features = F.interpolate(channels_first, list(shrunk), mode="bilinear")[0].permute(
                1, 2, 0
            )
        newline = self.image_newline.expand(shrunk[0], 1, -1)
        return torch.cat([embeds[0], torch.cat([features, newline], dim=1).flatten(0, 1)])


class VisionLanguageModel(ImageEncoding, LlamaForCausalLM):
    """A Llama-style language model that reads images (LLaVA, Idefics3, Qwen2-VL, ...)."""


class GemmaVisionLanguageModel(ImageEncoding, GemmaForCausalLM):
    """Gemma 3's language model reading images."""


def vision_language_model(language_class: type) -> type:
    """The vision-language model class over ``language_class``."""
    return GemmaVisionLanguageModel if language_class is GemmaForCausalLM else VisionLanguageModel
