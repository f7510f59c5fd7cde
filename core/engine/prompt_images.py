"""A prompt, its images (PIL images) and its videos (`video_decode.VideoFrames`) made into what
the engine takes: the prompt with each one's placeholder expanded, and each one's pixels as the
vision tower reads them."""

from collections.abc import Sequence

from spyglass.core.engine.image_inputs import ImageInput, expand_placeholders, place_images
from spyglass.core.engine.image_layout import ImageLayout, checked_layout
from spyglass.core.engine.image_preprocess import pixel_values, video_clip, video_pixel_values
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models.vision_config import VisionConfig


def images_in_prompt(
    token_ids: list[int],
    images: Sequence,
    vision: VisionConfig | None,
    max_model_len: int,
    field: str,
    videos: Sequence = (),
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """``token_ids`` with ``images`` and ``videos`` placed (`image_inputs.place_images`);
    unchanged with none. `InvalidRequestError` naming ``field`` for images or videos to a model
    that reads none, or more than its context holds (checked before any is resized)."""
    if not images and not videos:
        return token_ids, ()
    _check_reads_images(vision, field)
    alone = len(images) == 1  # LLaVA-OneVision's image alone (videos aside)
    needed = sum(len(layout.token_ids) for layout in _layouts(images, videos, vision, field))
    if needed > max_model_len:
        raise InvalidRequestError(
            f"{_counted(images, videos)} take {needed} tokens, more than the model's context of "
            f"{max_model_len}",
            field,
        )
    pixels = [pixel_values(image, vision, alone) for image in images]
    pixels += [video_pixel_values(video, vision) for video in videos]
    return place_images(token_ids, pixels, vision, field)


def prompt_with_image_tokens(
    token_ids: list[int],
    images: Sequence,
    vision: VisionConfig | None,
    field: str,
    videos: Sequence = (),
) -> list[int]:
    """``token_ids`` with each image's and video's placeholder expanded to the tokens it becomes,
    laid out from its size alone (nothing is resized): what a prompt counts.
    `InvalidRequestError` naming ``field`` for images or videos to a model that reads none or
    placeholders that do not match."""
    if not images and not videos:
        return token_ids
    _check_reads_images(vision, field)
    layouts = _layouts(images, videos, vision, field)
    return expand_placeholders(token_ids, layouts, vision, field)[0]


def _check_reads_images(vision: VisionConfig | None, field: str) -> None:
    if vision is None:
        raise InvalidRequestError(
            "this model reads no images (serve a vision model, e.g. LLaVA, for images)", field
        )


def _layouts(
    images: Sequence, videos: Sequence, vision: VisionConfig, field: str
) -> list[ImageLayout]:
    """The layouts of ``images``, then of ``videos`` (their `video_clip` at the first frame's size)."""
    alone = len(images) == 1
    layouts = [checked_layout(vision, *image.size, alone, field) for image in images]
    for video in videos:
        clip = video_clip(video, vision)
        layouts.append(checked_layout(vision, *video.frames[0].size, True, field, clip))
    return layouts


def _counted(images: Sequence, videos: Sequence) -> str:
    parts = [f"{len(images)} images"] if images else []
    return " and ".join([*parts, f"{len(videos)} videos"] if videos else parts)
