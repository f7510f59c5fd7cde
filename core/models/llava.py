"""LLaVA: a Llama-style decoder that reads images, each turned into prompt embeddings by a CLIP
vision tower and a projector (`clip_vision.ClipVisionEncoder`)."""

import torch

from spyglass.core.models.clip_vision import ClipVisionEncoder
from spyglass.core.models.llama import LlamaForCausalLM
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.kernels.backend import AttentionBackend


class LlavaForConditionalGeneration(LlamaForCausalLM):
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
        self.vision = ClipVisionEncoder(arch.vision, weights, device, self.dtype)

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The prompt embeddings ``[n, tokens_per_image, hidden_size]`` of ``n`` preprocessed
        images ``[n, channels, image_size, image_size]``, in the activations' dtype."""
        return self.vision(pixel_values.to(self.final_norm.device))
