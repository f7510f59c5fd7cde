"""Prompt chunks of a model whose image tokens see their whole image (Gemma 3): a chunk never ends
inside a run of image tokens, since the run's first tokens attend to its last."""

from spyglass.core.engine.request import Request
from spyglass.core.models.vision_config import VisionConfig


def chunk_within_images(request: Request, start: int, num_new: int) -> int:
    """``num_new`` prompt tokens from position ``start``, cut back to the start of the run of
    image tokens they would end inside; 0 when the chunk starts in (or at) that run and cannot
    reach its end."""
    end = start + num_new
    for image in request.images:
        for run_start, run_end, _ in image.embedding_runs():
            if run_start < end < run_end:
                return max(0, run_start - start)
    return num_new


def check_image_chunks(vision: VisionConfig | None, max_num_batched_tokens: int) -> bool:
    """Whether prompt chunks must keep images whole (`chunk_within_images`): a vision model's
    whose image tokens see their whole image; ValueError when a step's token budget cannot hold
    one image's tokens."""
    if vision is None or not vision.bidirectional:
        return False
    if max_num_batched_tokens < vision.tokens_per_tile:
        raise ValueError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be at least "
            f"{vision.tokens_per_tile}: this model's image tokens attend to their whole image, "
            "so a step computes an image's tokens together"
        )
    return True
