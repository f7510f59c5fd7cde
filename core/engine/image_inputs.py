"""Images in a prompt: their pixels, the prompt positions their tokens fill, and the prompt's
placeholders expanded to the tokens each image becomes (`image_layout`)."""

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spyglass.core.engine.image_layout import ImageLayout, image_layout
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models.vision_config import VisionConfig

if TYPE_CHECKING:  # the request holds images; plugins load without torch
    import torch


@dataclass(frozen=True, slots=True)
class ImagePixels:
    """An image preprocessed: its tiles' pixels ``[tiles, channels, size, size]`` (float32;
    LLaVA's one tile is the image) and the image's own ``width`` and ``height``."""

    values: "torch.Tensor"
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a prompt: its tiles' pixels ``[tiles, channels, size, size]`` (float32), the
    prompt positions ``[offset, offset + length)`` its tokens fill, the runs ``(offset, length)``
    of image tokens among them (relative to ``offset``; they take the image's embeddings in
    order), the image's ``size`` (width, height) and a digest of its pixels, which names the
    image to the prefix cache (equal tokens with another image are other KV)."""

    pixel_values: "torch.Tensor"
    offset: int
    length: int
    digest: str
    runs: tuple[tuple[int, int], ...]
    size: tuple[int, int]

    @property
    def end(self) -> int:
        """The position after the image's last token."""
        return self.offset + self.length

    def embedding_runs(self) -> list[tuple[int, int, int]]:
        """``(start, end, first)``: the prompt positions ``[start, end)`` of each run of image
        tokens, whose embeddings are the image's ``first`` to ``first + end - start``."""
        spans, first = [], 0
        for at, length in self.runs:
            spans.append((self.offset + at, self.offset + at + length, first))
            first += length
        return spans


def place_images(
    token_ids: list[int], pixels: list[ImagePixels], vision: VisionConfig, field: str
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """The prompt with each image's placeholder expanded (`expand_placeholders`), and each
    image's `ImageInput`."""
    alone = len(pixels) == 1
    layouts = [image_layout(vision, image.width, image.height, alone) for image in pixels]
    expanded, offsets = expand_placeholders(token_ids, layouts, vision, field)
    images = tuple(
        ImageInput(
            image.values,
            offset,
            len(layout.token_ids),
            _digest(image.values),
            layout.runs,
            (image.width, image.height),
        )
        for image, layout, offset in zip(pixels, layouts, offsets)
    )
    return expanded, images


def expand_placeholders(
    token_ids: list[int], layouts: list[ImageLayout], vision: VisionConfig, field: str
) -> tuple[list[int], list[int]]:
    """The prompt with each placeholder token (`VisionConfig.placeholder_id`; one per image, in
    order) expanded to its image's layout, and where each layout starts; where a layout meets a
    prompt token that `VisionConfig.token_merges` joins with its first or last, the two are one
    token. A prompt already expanded (each layout in order, with no other placeholders) is kept
    as it is. `InvalidRequestError` naming ``field`` when the placeholders do not match the
    images."""
    placeholder = vision.placeholder_id
    merges = {(a, b): ab for a, b, ab in vision.token_merges}
    offsets = _expanded_offsets(token_ids, layouts, placeholder, merges)
    if offsets is not None:
        return token_ids, offsets
    found = token_ids.count(placeholder)
    if found != len(layouts):
        raise InvalidRequestError(
            f"the prompt has {found} image placeholders for {len(layouts)} images "
            "(one per image, where the image goes)",
            field,
        )
    expanded, offsets, pending = [], [], iter(layouts)
    after_image = False
    for token in token_ids:
        if token == placeholder:
            layout = list(next(pending).token_ids)
            joined = merges.get((expanded[-1], layout[0])) if expanded else None
            if joined is not None:
                expanded.pop()
                layout[0] = joined
            offsets.append(len(expanded))
            expanded += layout
            after_image = True
            continue
        joined = merges.get((expanded[-1], token)) if after_image else None
        if joined is not None:
            expanded[-1] = joined
        else:
            expanded.append(token)
        after_image = False
    return expanded, offsets


def _expanded_offsets(
    token_ids: list[int], layouts: list[ImageLayout], placeholder: int, merges: dict
) -> list[int] | None:
    """Where each layout starts in ``token_ids`` when the prompt holds them all, in order (their
    first and last tokens perhaps joined with their neighbours'), and no placeholder outside
    them; else None."""
    if token_ids.count(placeholder) != sum(
        layout.token_ids.count(placeholder) for layout in layouts
    ):
        return None
    offsets, start = [], 0
    for layout in layouts:
        tokens, width = list(layout.token_ids), len(layout.token_ids)
        firsts = {tokens[0]} | {ab for (_, b), ab in merges.items() if b == tokens[0]}
        lasts = {tokens[-1]} | {ab for (a, _), ab in merges.items() if a == tokens[-1]}
        at = next(
            (
                i
                for i in range(start, len(token_ids) - width + 1)
                if token_ids[i] in firsts
                and token_ids[i + width - 1] in lasts
                and token_ids[i + 1 : i + width - 1] == tokens[1:-1]
            ),
            None,
        )
        if at is None:
            return None
        offsets.append(at)
        # Two images in a row may share the token their suffix and prefix were joined into.
        start = at + width - bool(merges)
    return offsets


def _digest(pixel_values: "torch.Tensor") -> str:
    return hashlib.sha256(pixel_values.contiguous().numpy().tobytes()).hexdigest()


def image_digests(images: tuple[ImageInput, ...], start: int, end: int) -> tuple[str, ...]:
    """The digests of ``images`` that fill any of positions ``[start, end)``."""
    return tuple(image.digest for image in images if image.offset < end and image.end > start)
