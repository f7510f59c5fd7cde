"""A prompt and its images (PIL images) made into what the engine takes: the prompt with each
image's placeholder expanded, and each image's pixels as the vision tower reads them."""

from collections.abc import Sequence

from spyglass.core.engine.image_inputs import ImageInput, expand_placeholders, place_images
from spyglass.core.engine.image_layout import ImageLayout, checked_layout
from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models.vision_config import VisionConfig


def images_in_prompt(
    token_ids: list[int],
    images: Sequence,
    vision: VisionConfig | None,
    max_model_len: int,
    field: str,
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """``token_ids`` with ``images`` placed (`image_inputs.place_images`); unchanged with none.
    `InvalidRequestError` naming ``field`` for images to a model that reads none, or more than
    its context holds (checked before any is resized)."""
    if not images:
        return token_ids, ()
    _check_reads_images(vision, field)
    needed = sum(len(_layout(image, vision, len(images) == 1, field).token_ids) for image in images)
    if needed > max_model_len:
        raise InvalidRequestError(
            f"{len(images)} images take {needed} tokens, more than the model's context of "
            f"{max_model_len}",
            field,
        )
    pixels = [pixel_values(image, vision, len(images) == 1) for image in images]
    return place_images(token_ids, pixels, vision, field)


def prompt_with_image_tokens(
    token_ids: list[int], images: Sequence, vision: VisionConfig | None, field: str
) -> list[int]:
    """``token_ids`` with each image's placeholder expanded to the tokens the image becomes, laid
    out from its size alone (nothing is resized): what a prompt counts. `InvalidRequestError`
    naming ``field`` for images to a model that reads none or placeholders that do not match."""
    if not images:
        return token_ids
    _check_reads_images(vision, field)
    layouts = [_layout(image, vision, len(images) == 1, field) for image in images]
    return expand_placeholders(token_ids, layouts, vision, field)[0]


def _check_reads_images(vision: VisionConfig | None, field: str) -> None:
    if vision is None:
        raise InvalidRequestError(
            "this model reads no images (serve a vision model, e.g. LLaVA, for images)", field
        )


def _layout(image, vision: VisionConfig, alone: bool, field: str) -> ImageLayout:
    return checked_layout(vision, *image.size, alone, field)
