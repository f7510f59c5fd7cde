"""A vision-language model (LLaVA, Idefics3/SmolVLM): a Llama-style decoder that reads images,
each turned into prompt embeddings by its vision tower and projector (`clip_vision`,
`idefics3_vision`)."""

import torch

from spyglass.core.models.clip_vision import ClipVisionEncoder
from spyglass.core.models.idefics3_vision import Idefics3VisionEncoder
from spyglass.core.models.llama import LlamaForCausalLM
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.kernels.backend import AttentionBackend


class VisionLanguageModel(LlamaForCausalLM):
    """The language model of `LlamaForCausalLM`, whose prompts' image tokens take the embeddings
    `encode_images` gives (the runner passes them to ``hidden_states`` as ``image_rows``)."""

    def __init__(
        self,
        arch: ModelArchConfig,
        weights: dict[str, torch.Tensor],
        backend: AttentionBackend,
        device,
    ):
        super().__init__(arch, weights, backend, device)
        encoder = Idefics3VisionEncoder if arch.vision.tower == "idefics3" else ClipVisionEncoder
        self.vision = encoder(arch.vision, weights, device, self.dtype)

    @torch.inference_mode()
    def encode_images(self, pixel_values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's prompt embeddings ``[tokens, hidden_size]``, in the activations' dtype,
        for its preprocessed tiles ``[tiles, channels, image_size, image_size]``; the tiles of
        all the images run the tower together."""
        tiles = self.vision(torch.cat(pixel_values).to(self.final_norm.device))
        return [embeds.flatten(0, 1) for embeds in tiles.split([len(p) for p in pixel_values])]
