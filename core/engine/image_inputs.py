"""Images (and videos) in a prompt: their pixels, the prompt positions their tokens fill, and
the prompt's placeholders expanded to the tokens each becomes (`image_layout`)."""

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spyglass.core.engine.image_layout import ImageLayout, image_layout
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models.vision_config import VisionConfig

if TYPE_CHECKING:  # the request holds images; plugins load without torch
    import torch


@dataclass(frozen=True, slots=True)
class VideoClip:
    """What makes an image a video's ``frames``: read in ``steps`` (Qwen2-VL's of
    ``temporal_patch_size`` frames each, LLaVA-OneVision's a frame each), a step ``step_seconds``
    long; Qwen3-VL's ``step_times``, each step's time in the video (seconds), written before its
    tokens."""

    frames: int
    steps: int
    step_seconds: float
    step_times: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ImagePixels:
    """An image preprocessed: its tiles' pixels ``[tiles, channels, size, size]`` (float32;
    LLaVA's one tile is the image; Qwen2-VL's patches) and the image's own ``width`` and
    ``height``; a video's ``clip`` (its frames' size)."""

    values: "torch.Tensor"
    width: int
    height: int
    clip: VideoClip | None = None


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a prompt: its tiles' pixels ``[tiles, channels, size, size]`` (float32), the
    prompt positions ``[offset, offset + length)`` its tokens fill, the runs ``(offset, length)``
    of image tokens among them (relative to ``offset``; they take the image's embeddings in
    order), the image's ``size`` (width, height) and a digest of its pixels, which names the
    image to the prefix cache (equal tokens with another image are other KV); a video's
    ``clip``."""

    pixel_values: "torch.Tensor"
    offset: int
    length: int
    digest: str
    runs: tuple[tuple[int, int], ...]
    size: tuple[int, int]
    clip: VideoClip | None = None

    @property
    def steps(self) -> int:
        """The video's steps; an image's one."""
        return self.clip.steps if self.clip else 1

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
    """The prompt with each image's (and video's) placeholder expanded (`expand_placeholders`),
    and their `ImageInput` in prompt order."""
    # Whether an image is its prompt's only one (LLaVA-OneVision's): videos do not count.
    alone = sum(image.clip is None for image in pixels) == 1
    layouts = [
        image_layout(vision, image.width, image.height, alone, image.clip) for image in pixels
    ]
    expanded, offsets = expand_placeholders(token_ids, layouts, vision, field)
    images = (
        ImageInput(
            image.values,
            offset,
            len(layout.token_ids),
            _digest(image.values),
            layout.runs,
            (image.width, image.height),
            image.clip,
        )
        for image, layout, offset in zip(pixels, layouts, offsets)
    )
    return expanded, tuple(sorted(images, key=lambda image: image.offset))


def expand_placeholders(
    token_ids: list[int], layouts: list[ImageLayout], vision: VisionConfig, field: str
) -> tuple[list[int], list[int]]:
    """The prompt with each placeholder token (an image's `VisionConfig.placeholder_id`, a
    video's ``video_token_id``; one per image or video, each kind in the order of its
    ``layouts``) expanded to its layout, and where each layout starts; where a layout meets a
    prompt token that `VisionConfig.token_merges` joins with its first or last, the two are one
    token, and the tokens right around the placeholder that the layout replaces too
    (`ImageLayout.replaces_around`) are dropped. A prompt already expanded (each layout in
    order, with no other placeholders) is kept as it is. `InvalidRequestError` naming ``field``
    when the placeholders do not match the images and videos."""
    merges = {(a, b): ab for a, b, ab in vision.token_merges}
    kinds: dict[int, list[int]] = {}
    for index, layout in enumerate(layouts):
        kinds.setdefault(_placeholder(layout, vision), []).append(index)
    kinds.setdefault(vision.placeholder_id, [])
    if vision.video_token_id is not None:
        kinds.setdefault(vision.video_token_id, [])
    offsets = [0] * len(layouts)
    for placeholder, indices in kinds.items():
        found = _expanded_offsets(token_ids, [layouts[i] for i in indices], placeholder, merges)
        if found is None:
            break
        for index, offset in zip(indices, found):
            offsets[index] = offset
    else:
        return token_ids, offsets
    for placeholder, indices in kinds.items():
        found = token_ids.count(placeholder)
        if found != len(indices):
            what = "video" if placeholder == vision.video_token_id else "image"
            raise InvalidRequestError(
                f"the prompt has {found} {what} placeholders for {len(indices)} {what}s "
                f"(one per {what}, where the {what} goes)",
                field,
            )
    expanded, pending = [], {placeholder: iter(indices) for placeholder, indices in kinds.items()}
    after_image = False
    dropped_next = None
    for token in token_ids:
        if dropped_next is not None:
            drop, dropped_next = token == dropped_next, None
            if drop:
                continue
        if token in pending:
            index = next(pending[token])
            layout = list(layouts[index].token_ids)
            around = layouts[index].replaces_around
            if around is not None and expanded and expanded[-1] == around[0]:
                expanded.pop()
            joined = merges.get((expanded[-1], layout[0])) if expanded else None
            if joined is not None:
                expanded.pop()
                layout[0] = joined
            offsets[index] = len(expanded)
            expanded += layout
            after_image = True
            dropped_next = around[1] if around is not None else None
            continue
        joined = merges.get((expanded[-1], token)) if after_image else None
        if joined is not None:
            expanded[-1] = joined
        else:
            expanded.append(token)
        after_image = False
    return expanded, offsets


def _placeholder(layout: ImageLayout, vision: VisionConfig) -> int:
    """The prompt token that marks where the layout goes."""
    return vision.placeholder_id if layout.placeholder_id is None else layout.placeholder_id


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
