"""Images in a prompt: their pixels, the prompt positions their tokens fill, and the prompt's
placeholders expanded to one token per position."""

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models.vision_config import VisionConfig

if TYPE_CHECKING:  # the request holds images; plugins load without torch
    import torch


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a prompt: its preprocessed pixels ``[channels, size, size]`` (float32), the
    prompt positions ``[offset, offset + length)`` its tokens fill, and a digest of its pixels,
    which names the image to the prefix cache (equal tokens with another image are other KV)."""

    pixel_values: "torch.Tensor"
    offset: int
    length: int
    digest: str

    @property
    def end(self) -> int:
        """The position after the image's last token."""
        return self.offset + self.length


def place_images(
    token_ids: list[int], pixels: "list[torch.Tensor]", vision: VisionConfig, field: str
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """The prompt with each image's placeholder token (``vision.image_token_id``, one per image,
    in order) expanded to ``vision.tokens_per_image`` of them, and each image's `ImageInput`.
    A prompt already expanded (a run of that many placeholders per image) is kept as it is.
    `InvalidRequestError` naming ``field`` when the placeholders do not match the images."""
    placeholder, width = vision.image_token_id, vision.tokens_per_image
    found = [i for i, token in enumerate(token_ids) if token == placeholder]
    if len(found) == len(pixels) * width and all(
        found[k * width + width - 1] - found[k * width] == width - 1 for k in range(len(pixels))
    ):
        offsets = found[::width]
        expanded = token_ids
    elif len(found) == len(pixels):
        expanded, offsets = [], []
        for token in token_ids:
            if token == placeholder:
                offsets.append(len(expanded))
                expanded += [placeholder] * width
            else:
                expanded.append(token)
    else:
        raise InvalidRequestError(
            f"the prompt has {len(found)} image placeholders for {len(pixels)} images "
            "(one per image, where the image goes)",
            field,
        )
    images = tuple(
        ImageInput(values, offset, width, _digest(values))
        for values, offset in zip(pixels, offsets)
    )
    return expanded, images


def _digest(pixel_values: "torch.Tensor") -> str:
    return hashlib.sha256(pixel_values.contiguous().numpy().tobytes()).hexdigest()


def image_digests(images: tuple[ImageInput, ...], start: int, end: int) -> tuple[str, ...]:
    """The digests of ``images`` that fill any of positions ``[start, end)``."""
    return tuple(image.digest for image in images if image.offset < end and image.end > start)
