"""A prompt and its images (PIL images) made into what the engine takes: the prompt with each
image's placeholder expanded, and each image's pixels as the vision tower reads them."""

from collections.abc import Sequence

from spyglass.core.engine.image_inputs import ImageInput, place_images
from spyglass.core.engine.image_layout import image_layout
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
    if vision is None:
        raise InvalidRequestError(
            "this model reads no images (serve a vision model, e.g. LLaVA, for images)", field
        )
    needed = sum(image_tokens(image.size, vision) for image in images)
    if needed > max_model_len:
        raise InvalidRequestError(
            f"{len(images)} images take {needed} tokens, more than the model's context of "
            f"{max_model_len}",
            field,
        )
    pixels = [pixel_values(image, vision) for image in images]
    return place_images(token_ids, pixels, vision, field)


def image_tokens(size: tuple[int, int], vision: VisionConfig) -> int:
    """The prompt tokens an image of ``size`` (width, height) becomes (`image_layout`)."""
    return len(image_layout(vision, *size).token_ids)
